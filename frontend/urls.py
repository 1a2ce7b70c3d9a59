from django.urls import path

from . import views

app_name = "frontend"
urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("provider/", views.provider_workers, name="provider-workers"),
]
