"""REST API (DRF): thin views that validate input and call one service or selector."""

from __future__ import annotations

import logging
import re

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from dataplane.jobs import JobSpec
from dataplane.replay import RedisError

from .. import services
from ..core import provisioning
from ..infra import stream
from ..models import Job, Worker
from ..reads import ledger, scheduling, selectors
from ..services.audit_verify import audit_standing
from . import controls, exports, samples
from . import serializers as s
from .auth import AGENT_KEY_ALLOWED, learner_problem
from .plan_schema import CapacityPlanSerializer
from .renderers import TomlRenderer, YamlRenderer
from .schema import ErrorSerializer

log = logging.getLogger(__name__)


def _service_call(fn, **kwargs):
    """Run a service (it owns its transaction); turn its ServiceError into a 400 whose detail names the field."""
    try:
        return fn(**kwargs)
    except services.ServiceError as err:
        field, _, reason = str(err).partition(": ")
        raise ValidationError({field: [reason or str(err)]}) from None


def _since(request) -> int:
    """The ``since`` query parameter: a step number (ASCII digits; '²' passes ``str.isdigit``, not ``int``)."""
    since = request.query_params.get("since", "0")
    if not re.fullmatch(r"[0-9]{1,18}", since):
        raise ValidationError({"since": ["must be a non-negative integer"]})
    return int(since)


class WorkerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Machines of the signed-in provider (staff see all). Registering returns the agent key once."""

    serializer_class = s.WorkerSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Worker.objects.none()
        return selectors.workers_visible_to(self.request.user)

    @extend_schema(parameters=[OpenApiParameter("removed", bool, description="Include removed workers.")])
    def list(self, request):
        qs = self.get_queryset() if controls.listed(request.query_params, "removed") else \
            self.get_queryset().filter(removed_at=None)
        page = selectors.workers_with_figures(self.paginate_queryset(qs))
        return self.get_paginated_response(s.WorkerSerializer(page, many=True).data)

    def _worker_reply(self, worker: Worker) -> Response:
        return Response(s.WorkerSerializer(selectors.workers_with_figures([worker])[0]).data)

    @extend_schema(request=None, responses={200: s.WorkerSerializer})
    def destroy(self, request, pk=None):
        """Remove (unregister) the worker: its activation released, its agent key revoked, hidden from lists;
        its history and ledger entries kept (docs/ledger.md)."""
        return self._worker_reply(_service_call(services.worker_remove, worker=self.get_object()))

    @extend_schema(methods=["get"], responses=dict)
    @extend_schema(methods=["post"], request=controls.PriceSerializer, responses=s.WorkerSerializer)
    @action(detail=True, methods=["get", "post"])
    def price(self, request, pk=None):
        """GET: the worker's price history. POST: its price from now on (its open activation's later intervals
        are billed at it; the ledger shows both rates)."""
        worker = self.get_object()
        if request.method == "GET":
            return Response({"price_per_hour": str(worker.price_per_hour), "history": ledger.price_history(worker)})
        form = controls.PriceSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        return self._worker_reply(_service_call(services.worker_price_set, worker=worker, **form.validated_data))

    @extend_schema(request=None, responses=s.WorkerSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """No new activations; its open activation is released now (billed up to now, leases returned)."""
        return self._worker_reply(_service_call(services.worker_pause, worker=self.get_object()))

    @extend_schema(request=None, responses=s.WorkerSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Activations again, from the scheduler's next re-plan."""
        return self._worker_reply(_service_call(services.worker_resume, worker=self.get_object()))

    def retrieve(self, request, pk=None):
        worker = selectors.workers_with_figures([self.get_object()])[0]
        return Response(s.WorkerSerializer(worker).data)

    @extend_schema(responses=s.WorkerAuditSerializer(many=True))
    @action(detail=True, methods=["get"])
    def audits(self, request, pk=None):
        """The learners' audits of the worker, newest first, each failure with the site's check of it, and its
        standing: the failures that count toward suspension and why (docs/trust.md "Audits the site checks")."""
        worker = self.get_object()
        page = self.paginate_queryset(worker.audits.order_by("-created_at", "-id"))
        reply = self.get_paginated_response(s.WorkerAuditSerializer(page, many=True).data)
        reply.data["standing"] = audit_standing(worker)
        return reply

    @extend_schema(request=s.WorkerRegisterSerializer, responses={201: s.WorkerRegisteredSerializer})
    def create(self, request):
        form = s.WorkerRegisterSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        worker, key = _service_call(services.worker_register, user=request.user, **form.validated_data)
        data = s.WorkerSerializer(selectors.workers_with_figures([worker])[0]).data | {"agent_key": key}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(methods=["get"], responses=s.CalibrationSerializer(many=True))
    @extend_schema(methods=["post"], request=s.CalibrationSerializer, responses={201: s.CalibrationSerializer})
    @action(detail=True, methods=["get", "post"], permission_classes=AGENT_KEY_ALLOWED, pagination_class=None)
    def calibrations(self, request, pk=None):
        """Benchmarked throughput per model and task. An agent (agent key) may report only its own."""
        worker = self.get_object()
        if isinstance(request.auth, Worker) and request.auth.pk != worker.pk:
            raise PermissionDenied("an agent may report only for its own worker")
        if request.method == "GET":
            return Response(s.CalibrationSerializer(worker.calibrations.all(), many=True).data)
        form = s.CalibrationSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        calibration = _service_call(services.worker_calibrate, worker=worker, **form.validated_data)
        return Response(s.CalibrationSerializer(calibration).data, status=status.HTTP_201_CREATED)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """GRPO jobs of the signed-in owner (staff see all)."""

    serializer_class = s.JobSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        qs = selectors.jobs_visible_to(self.request.user).select_related("owner")
        if self.action == "list" and not controls.listed(self.request.query_params, "archived"):
            return qs.filter(archived_at=None)  # archived jobs are listed only when asked for (?archived=1)
        return qs

    def perform_create(self, serializer):
        spec = serializer.validated_data["spec"]
        serializer.instance = _service_call(services.job_create, owner=self.request.user, spec=spec)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        """Delete a job that never ran; one that did is archived instead (its ledger stays)."""
        _service_call(services.job_delete, job=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def archive(self, request, pk=None):
        """Hide an ended (or draft) job from lists (``?archived=1`` shows it); its ledger and history stay."""
        return Response(s.JobSerializer(_service_call(services.job_archive, job=self.get_object())).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def unarchive(self, request, pk=None):
        job = _service_call(services.job_archive, job=self.get_object(), archived=False)
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=controls.BudgetSerializer, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def budget(self, request, pk=None):
        """Change the job's budget (``budget_usd``; null: no cap). A job paused at its budget runs again when the
        new one leaves room for its next step."""
        form = controls.BudgetSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        job = _service_call(services.job_budget_set, job=self.get_object(), **form.validated_data)
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        job = _service_call(services.job_start, job=self.get_object())
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = _service_call(services.job_finish, job=self.get_object(), status=Job.Status.CANCELLED,
                            reason=f"cancelled by {request.user.get_username()}", code=Job.Reason.BY_PERSON)
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Release the job's workers (generation and billing stop); queued trajectories are still trained."""
        reason = request.data.get("reason") if isinstance(request.data, dict) else None  # the learner says why
        learner = isinstance(reason, str) and bool(reason)
        job = _service_call(services.job_pause, job=self.get_object(), by=request.user.get_username(),
                            reason=f"paused by the learner: {reason}"[:500] if learner else "",
                            code=Job.Reason.LEARNER if learner else Job.Reason.BY_PERSON)
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Run a paused job again (or a failed one: its learner, restarted, continues from its checkpoint);
        the scheduler activates a pool at once."""
        job = _service_call(services.job_resume, job=self.get_object())
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=s.JobFinishSerializer, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def finish(self, request, pk=None):
        """The learner reports the job's end (completed or failed)."""
        form = s.JobFinishSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        job = _service_call(services.job_finish, job=self.get_object(), **form.validated_data,
                            code=Job.Reason.LEARNER)
        return Response(s.JobSerializer(job).data)

    @extend_schema(methods=["get"], responses=s.MetricSerializer(many=True), parameters=[OpenApiParameter(
        "since", int, description="Only the steps after this one (default 0: all).")])
    @extend_schema(methods=["post"], request=s.MetricReportSerializer, responses={201: s.MetricSerializer},
                   parameters=[OpenApiParameter("X-Echo2-Learner", str, OpenApiParameter.HEADER, description=(
                       "The job's learner credential (from the transfer secret); required when `audits` is "
                       "not empty."))])
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def metrics(self, request, pk=None):
        """GET: the learner's per-step metrics (``?since=STEP`` for new ones). POST: the learner reports a step;
        audits of workers only with the job's learner credential (header ``X-Echo2-Learner``, docs/trust.md)."""
        job = self.get_object()
        if request.method == "GET":
            rows = job.metrics.filter(step__gt=_since(request)).order_by("step")
            return Response(s.MetricSerializer(rows, many=True).data)
        form = s.MetricReportSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        values = dict(form.validated_data)
        if values.get("audits") and (problem := learner_problem(request, job)) is not None:
            raise PermissionDenied(f"audits: only the job's learner reports audits of workers ({problem}; the "
                                   f"learner sends its credential in the X-Echo2-Learner header)")
        step = values.pop("step")
        metric = _service_call(services.metrics_record, job=job, step=step, values=values)
        return Response(s.MetricSerializer(metric).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=samples.SampleSerializer(many=True), parameters=[samples.SampleQuerySerializer])
    @action(detail=True, methods=["get"], pagination_class=None)
    def samples(self, request, pk=None):
        """A few records the learner trained, newest step first (``?min_reward=&max_reward=&limit=``)."""
        job = self.get_object()
        query = samples.SampleQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = selectors.job_samples(job=job, **query.validated_data)
        return Response(samples.SampleSerializer(rows, many=True).data)

    @extend_schema(responses=CapacityPlanSerializer)
    @action(detail=True, methods=["get"])
    def plan(self, request, pk=None):
        """The capacity plan: feasibility of (S, kappa) against measured T_train and T_bcast, the expected
        largest lag, the throughput target, the cheapest worker set meeting it (exact solver) with its price
        per hour, and the set the paper's greedy by unit cost would have chosen."""
        job = self.get_object()
        try:
            return Response(scheduling.job_plan(job))
        except provisioning.ProvisioningInputError as err:
            raise ValidationError({err.field: [err.message]}) from None

    @extend_schema(request=s.JobPlanRequestSerializer, responses=CapacityPlanSerializer)
    @action(detail=False, methods=["post"], url_path="plan", url_name="plan-preview")
    def plan_preview(self, request):
        """The capacity plan of a job before it exists; creates nothing. The body is that of creating the job
        plus optional estimates ``t_train_s`` and ``t_bcast_s``. Without them the figures the newest earlier
        job of the same model and task measured are used (``measurements.sources`` names it); without those
        the plan is the calibration phase: every available worker, listed under ``calibration``."""
        form = s.JobPlanRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            return Response(scheduling.spec_plan(form.validated_data["spec"], user=request.user,
                                                 t_train=form.validated_data["t_train_s"],
                                                 t_bcast=form.validated_data["t_bcast_s"]))
        except provisioning.ProvisioningInputError as err:
            raise ValidationError({err.field: [err.message]}) from None

    @extend_schema(
        responses={(200, "application/json"): JobSpec, (200, "application/toml"): OpenApiTypes.STR,
                   (200, "application/yaml"): JobSpec},
        parameters=[OpenApiParameter("format", str, enum=["json", "toml", "yaml"], description=(
            "json (default), toml or yaml; or ask by the Accept header."))])
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, TomlRenderer, YamlRenderer])
    def spec(self, request, pk=None, format=None):
        """The job's resolved settings, every default filled in (kappa, the loss), as a job file that
        ``echo2 job submit`` takes back (docs/cli.md)."""
        job = self.get_object()
        name = f"job-{job.pk}.{request.accepted_renderer.format}"
        return Response(selectors.job_spec(job), headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def summary(self, request, pk=None):
        """Headline figures: step, reward, staleness, T_train, T_bcast, active workers, cost so far (``cost_usd``:
        the time workers reported installing or generating, at their prices, up to their last heartbeat)."""
        job = self.get_object()
        return Response(selectors.job_summary(job) | {"counters": stream.replay(job.pk).counters()})

    @extend_schema(responses=dict, parameters=[OpenApiParameter(
        "since", int, description="Send the learner steps after this one (default 0: all, up to 1000).")])
    @action(detail=True, methods=["get"])
    def live(self, request, pk=None):
        """What the job page draws: the summary, learner steps after ``since`` (with staleness histograms),
        recent snapshots (T_bcast), active workers with their installed versions, reported states (``state``:
        loading, installing, generating, idle or failed) and billed time and cost, and the forwarding chains
        of the newest snapshot (who feeds whom, who is behind)."""
        job = self.get_object()
        return Response(selectors.job_live(job, since_step=_since(request)))

    @extend_schema(methods=["get"], responses=s.SnapshotSerializer(many=True))
    @extend_schema(methods=["post"], request=s.SnapshotSerializer, responses={201: s.SnapshotSerializer})
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def snapshots(self, request, pk=None):
        """GET: published snapshots. POST: the learner publishes one (agents are told at once)."""
        job = self.get_object()
        if request.method == "GET":
            return Response(s.SnapshotSerializer(job.snapshots.all(), many=True).data)
        form = s.SnapshotSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        snap = _service_call(services.snapshot_publish, job=job, **form.validated_data)
        return Response(s.SnapshotSerializer(snap).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.LearnerAnnounceSerializer, responses=s.LearnerAnnouncedSerializer)
    @action(detail=True, methods=["post"])
    def learner(self, request, pk=None):
        """The learner announces itself and its calibrated T_train. The reply carries the job's transfer secret
        (the learner checks workers' credentials with it), so it takes the owner's token, not an agent key."""
        job = self.get_object()
        if job.owner_id != request.user.pk:  # staff see every job, but its secret only if they may export it
            raise PermissionDenied("only the job's owner announces its learner: the reply carries the job's "
                                   "transfer secret, which only those who may export its weights hold")
        form = s.LearnerAnnounceSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        job = _service_call(services.learner_announce, job=job, **form.validated_data)
        return Response(s.LearnerAnnouncedSerializer(job).data)

    @extend_schema(request=None, responses={200: s.LearnerStreamsSerializer, 503: OpenApiResponse(
        ErrorSerializer, description="The streams' Redis did not answer; retry (Retry-After).")})
    @action(detail=True, methods=["post"], url_path="learner/streams")
    def learner_streams(self, request, pk=None):
        """A learner starts: its door to the job's streams, a Redis user of its own whose keys are the job's alone,
        with a fresh password (the previous learner's is refused from now on; the user is deleted when the job
        ends). The owner's token only: the reply is a credential."""
        job = self.get_object()
        if job.owner_id != request.user.pk:
            raise PermissionDenied("only the job's owner lets its learner in: the reply is a credential to its streams")
        try:
            door = _service_call(services.learner_streams_open, job=job)
        except RedisError as err:
            log.warning("job %s: no learner door: Redis: %s", job.pk, err)
            return Response({"detail": "the job's streams (Redis) did not answer; retry in a moment"}, status=503,
                            headers={"Retry-After": "2"})
        return Response(s.LearnerStreamsSerializer(door).data)

    @extend_schema(
        responses={(200, "application/x-tar"): OpenApiTypes.BINARY,
                   503: OpenApiResponse(ErrorSerializer, description="The learner's snapshot server could not "
                                        "be reached, refused, or served bad bytes (one message for all: the site's "
                                        "log has the detail); `detail` names the offline command."),
                   409: OpenApiResponse(ErrorSerializer, description="The job has ended and its learner exited "
                                        "with it (the site keeps no weights); `detail` names the offline command."),
                   502: OpenApiResponse(ErrorSerializer, description="The snapshot cannot be exported as asked "
                                        "(its files do not make a model).")},
        parameters=[OpenApiParameter("version", int, description="Snapshot version (default: the newest "
                                     "published; 0 is the base model)."),
                    OpenApiParameter("dtype", str, enum=list(exports.DTYPES), description="as-trained (default) "
                                     "or bf16 (floating weights cast to bfloat16).")])
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        """The owner's model as a Hugging Face directory (config, tokenizer, ``model.safetensors``) in an
        uncompressed tar, ``job<id>-v<version>/``: what ``from_pretrained`` and vLLM load as is (docs/cli.md,
        ``echo2 job export``). Fetched from the job's learner while it runs."""
        version, dtype = exports.parse_query(request.query_params)
        planned = exports.job_export(job=self.get_object(), user=request.user, version=version, dtype=dtype)
        pieces = planned.pieces()
        if isinstance(request._request, ASGIRequest):  # daphne: read the learner off the event loop
            pieces = exports.off_the_loop(pieces)
        response = StreamingHttpResponse(pieces, content_type="application/x-tar")
        response["Content-Length"] = str(planned.size)
        response["Content-Disposition"] = f'attachment; filename="{planned.folder}.tar"'
        response["X-Echo2-Version"], response["X-Echo2-Dtype"] = str(planned.version), planned.dtype
        return response
