from django.urls import path

from annotation import checkpoint_views, views

app_name = "annotation"

urlpatterns = [
    path("", views.home, name="home"),
    path("join/", views.join, name="join"),
    path("join/<str:token>/", views.join_legacy, name="join_legacy"),
    path("c/<int:pk>/", views.annotate, name="annotate"),
    path("c/<int:pk>/submit/", views.submit, name="submit"),
    path("c/<int:pk>/skip/", views.skip, name="skip"),
    path("c/<int:pk>/undo/", views.undo, name="undo"),
    path("campaigns/", views.campaign_list, name="campaign_list"),
    path("campaigns/new/", views.campaign_new, name="campaign_new"),
    path("campaigns/upload/", views.campaign_upload, name="campaign_upload"),
    path("campaigns/<int:pk>/", views.campaign_detail, name="campaign_detail"),
    path("campaigns/<int:pk>/preview/", views.campaign_preview, name="campaign_preview"),
    path("campaigns/<int:pk>/results/", views.campaign_results, name="campaign_results"),
    path("campaigns/<int:pk>/results.json", views.campaign_results_json, name="campaign_results_json"),
    path("campaigns/<int:pk>/export.jsonl", views.export_jsonl, name="export_jsonl"),
    path("campaigns/<int:pk>/export.csv", views.export_csv, name="export_csv"),
    path("campaigns/<int:pk>/ai-judgments.csv", views.export_ai_csv, name="export_ai_csv"),
    path("campaigns/<int:pk>/reward-model/", views.train_reward_model, name="train_reward_model"),
    path("campaigns/<int:pk>/dpo/", views.fine_tune_dpo, name="fine_tune_dpo"),
    path("campaigns/<int:pk>/ai-judges/<int:judge_id>.json", views.ai_judge_json, name="ai_judge_json"),
    path("reward-models/", views.reward_model_list, name="reward_models"),
    path("reward-models/<int:pk>.json", views.reward_model_json, name="reward_model_json"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path(
        "runs/<int:run_id>/checkpoints-campaign/",
        checkpoint_views.checkpoints_campaign,
        name="checkpoints_campaign",
    ),
]
