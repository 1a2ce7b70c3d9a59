"""``/api/datasets/``: an owner uploads a data set's archive; the job's learner downloads it (docs/datasets.md).

``POST /api/datasets/`` takes the archive as the raw body (any ``Content-Type``: ``application/x-tar``, what
``dataplane.dataset.content.pack`` writes and ``echo2 job submit`` sends) and answers its digest; ``GET
/api/datasets/<digest>/`` gives it back to the person who uploaded it (the learner runs with the owner's token).
Nothing here reads a path a request names: uploads are stored and found by digest.
"""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from ..services import datasets
from .schema import ErrorSerializer
from .views import _service_call

UPLOADED = inline_serializer("DatasetUploaded", {"digest": serializers.CharField(), "bytes": serializers.IntegerField(),
                                                 "files": serializers.ListField(child=serializers.CharField())})


def _store(**kwargs) -> tuple[dict | None, datasets.ServiceError | None]:
    try:
        return datasets.dataset_store(**kwargs), None
    except (datasets.TooLarge, datasets.OverQuota) as err:
        return None, err


class DatasetViewSet(viewsets.ViewSet):
    parser_classes: list = []  # the body is the archive, read as a stream by the service
    lookup_value_regex = "[0-9a-f]{64}"

    @extend_schema(request={"application/octet-stream": OpenApiTypes.BINARY},
                   responses={201: UPLOADED, 400: ErrorSerializer, 409: ErrorSerializer, 413: ErrorSerializer},
                   description="Upload a data set's archive (the raw body, at most ECHO2_DATASET_MAX_BYTES); "
                               "the answer names its digest, which a dataset job's data.digest names.")
    def create(self, request):
        length = request.META.get("CONTENT_LENGTH") or None
        if length is not None and not str(length).isdigit():
            raise ValidationError({"body": ["a bad Content-Length"]})
        stored, refused = _service_call(_store, owner=request.user, stream=request._request,
                                        length=int(length) if length is not None else None)
        if refused is not None:  # too large for one upload (413) or for the owner's quota (409)
            return Response({"detail": str(refused), "errors": {"body": [str(refused).partition(": ")[2]]}},
                            status=413 if isinstance(refused, datasets.TooLarge) else 409)
        return Response(stored, status=status.HTTP_201_CREATED)

    @extend_schema(responses={(200, "application/x-tar"): OpenApiTypes.BINARY,
                              404: OpenApiResponse(ErrorSerializer, description="Not uploaded by you.")})
    def retrieve(self, request, pk: str | None = None):
        path = datasets.dataset_file(user=request.user, digest=pk or "")
        if path is None:
            raise NotFound(f"no data set {str(pk)[:12]}... uploaded by you")
        return FileResponse(path.open("rb"), content_type="application/x-tar")
