from django.contrib import admin

from annotation.models import Assignment, Campaign, Invite, Item, Judgment, Membership, RewardModel


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "kind", "status", "overlap", "created")
    list_filter = ("kind", "status")


@admin.register(Judgment)
class JudgmentAdmin(admin.ModelAdmin):
    list_display = ("id", "campaign", "item", "annotator", "choice", "seconds", "created")
    list_filter = ("campaign",)


@admin.register(RewardModel)
class RewardModelAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "campaign", "status", "progress", "created")


@admin.register(Item)
class ItemAdmin(admin.ModelAdmin):
    list_display = ("id", "campaign", "system_a", "system_b", "slots_taken", "judgment_count", "gold")
    raw_id_fields = ("campaign", "sample_a", "sample_b")  # a select of every sample would be huge


admin.site.register([Assignment, Membership, Invite])
