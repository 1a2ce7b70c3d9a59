from django.templatetags.static import static
from django.urls import path, re_path
from django.views.generic import RedirectView

from . import controls, dist, views

app_name = "frontend"
urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("home/", views.home, name="home"),  # where signing in lands (LOGIN_REDIRECT_URL)
    # browsers ask for /favicon.ico whatever the page links; the icon is a static SVG
    path("favicon.ico", RedirectView.as_view(url=static("frontend/favicon.svg"), permanent=True)),
    path("jobs/new/", views.job_launch, name="job-launch"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    re_path(r"^jobs/(?P<job_id>\d+)/(?P<verb>start|pause|resume|cancel)/$", views.job_control, name="job-control"),
    re_path(r"^jobs/(?P<job_id>\d+)/manage/(?P<verb>budget|archive|unarchive|delete)/$", controls.job_manage,
            name="job-manage"),
    path("provider/", views.provider_workers, name="provider-workers"),
    re_path(r"^provider/workers/(?P<worker_id>\d+)/(?P<verb>price|pause|resume|remove)/$", controls.worker_control,
            name="worker-control"),
    path("provider/token/", views.api_token, name="api-token"),
    path("marketplace/", views.marketplace_overview, name="marketplace"),
    # the agent's wheel, for `pip install` (no login: pip sends none, and the agent is no secret)
    path(f"dist/{dist.ALIAS}", dist.wheel_alias, name="dist-alias"),
    path("dist/<str:filename>", dist.wheel, name="dist-wheel"),
]
