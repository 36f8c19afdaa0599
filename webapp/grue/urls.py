from django.urls import path

from webapp.grue import views

app_name = "grue"

urlpatterns = [
    path("", views.board, name="board"),
    path("data.json", views.board_json, name="data"),
]
