from rest_framework.routers import DefaultRouter

from .api.views import JobViewSet, WorkerViewSet

router = DefaultRouter()
router.register("workers", WorkerViewSet, basename="worker")
router.register("jobs", JobViewSet, basename="job")

urlpatterns = router.urls
