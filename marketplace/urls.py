from django.urls import path
from rest_framework.routers import DefaultRouter

from .api.datasets import DatasetViewSet
from .api.ledger import LedgerView
from .api.views import JobViewSet, WorkerViewSet

router = DefaultRouter()
router.register("workers", WorkerViewSet, basename="worker")
router.register("jobs", JobViewSet, basename="job")
router.register("datasets", DatasetViewSet, basename="dataset")

urlpatterns = [path("ledger/", LedgerView.as_view(), name="ledger"), *router.urls]
