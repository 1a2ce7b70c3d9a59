"""The capacity plan as the API answers it (``GET /api/jobs/<id>/plan/``, ``POST /api/jobs/plan/``): response
serializers that describe ``scheduling.job_plan``'s dict in the OpenAPI schema. Nothing is validated with them."""

from __future__ import annotations

from rest_framework import serializers


class PlanJobRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class PlanEstimateSerializer(serializers.Serializer):
    value = serializers.FloatField(allow_null=True, help_text="Seconds; null when unknown.")
    source = serializers.ChoiceField(choices=["learner", "snapshot", "given", "earlier job", "none"])
    note = serializers.CharField(help_text="Where the figure comes from, for a person.")
    job = PlanJobRefSerializer(allow_null=True, help_text="The earlier job it was measured in, if any.")


class PlanSourcesSerializer(serializers.Serializer):
    t_train = PlanEstimateSerializer()
    t_bcast = PlanEstimateSerializer()


class PlanMeasurementsSerializer(serializers.Serializer):
    t_train = serializers.FloatField(allow_null=True, help_text="T_train the plan uses, seconds per step.")
    t_bcast = serializers.FloatField(help_text="T_bcast the plan uses, seconds per broadcast.")
    mu_pool = serializers.FloatField(help_text="Live capacity of the job's active workers, trajectories/s.")
    sources = PlanSourcesSerializer()


class PlanReportSerializer(serializers.Serializer):
    feasible = serializers.BooleanField(allow_null=True, help_text="null while T_train is unknown (calibration).")
    reason = serializers.CharField()
    staleness = serializers.IntegerField(required=False)
    kappa = serializers.IntegerField(required=False)
    mu_min = serializers.FloatField(required=False, allow_null=True, help_text="kappa*R / (kappa*T_train - T_bcast).")
    target = serializers.FloatField(required=False, allow_null=True, help_text="Needed throughput gamma * mu_min.")
    overlap = serializers.BooleanField(required=False, allow_null=True)
    max_lag = serializers.IntegerField(required=False, allow_null=True, help_text="Expected largest version lag.")
    lag_bound = serializers.CharField(required=False)
    lag_within_budget = serializers.BooleanField(required=False, allow_null=True)


class PlanWorkerSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    price_per_hour = serializers.FloatField(help_text="c_i, USD/h.")
    throughput = serializers.FloatField(allow_null=True, help_text="mu_i, trajectories/s; null if unmeasured.")
    availability = serializers.FloatField(required=False, help_text="a_i in [0, 1].")
    reliability = serializers.FloatField(required=False, help_text="r_i in [0, 1]: the long-run record.")
    unit_cost = serializers.FloatField(required=False, help_text="rho_i = c_i / (a_i r_i mu_i).")
    source = serializers.CharField(allow_null=True, help_text="Where mu_i comes from: live, calibration or last "
                                                              "measured.")


class PlanSelectionSerializer(serializers.Serializer):
    method = serializers.CharField()
    optimal = serializers.BooleanField()
    note = serializers.CharField(allow_blank=True)
    target = serializers.FloatField()
    price_per_hour = serializers.FloatField(help_text="Total USD/h of the chosen workers.")
    throughput = serializers.FloatField()
    shortfall = serializers.FloatField(help_text="target - throughput when the whole pool falls short, else 0.")
    workers = PlanWorkerSerializer(many=True)


class PlanCalibrationSerializer(serializers.Serializer):
    workers = PlanWorkerSerializer(many=True)
    price_per_hour = serializers.FloatField()
    throughput = serializers.FloatField(help_text="Measured part only.")


class PlanUnmeasuredSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    price_per_hour = serializers.FloatField()


class PlanRequirementsSerializer(serializers.Serializer):
    min_gpu_memory_gb = serializers.FloatField(allow_null=True, help_text="Memory matched on, GB; null: none.")
    memory = serializers.CharField(help_text="Where it comes from: given, or the estimate and its parts.")
    engine = serializers.CharField()
    max_price_per_hour = serializers.FloatField(allow_null=True)
    min_reliability = serializers.FloatField()
    user_code = serializers.ListField(child=serializers.CharField(), help_text=(
        "The owner's code the job's task runs on a worker ('pkg.module:fn'); empty: none. Only workers whose "
        "providers opted in (echo2-agent run --allow-user-code) match such a job."))
    qualify = serializers.IntegerField(help_text="Online workers that meet them.")
    total = serializers.IntegerField(help_text="Online workers (busy in other jobs too).")
    excluded = serializers.DictField(child=serializers.IntegerField(), help_text=(
        "Workers that do not, per reason: user code (their providers do not run the job's user code), memory, "
        "engine, price, reliability, hardware unknown."))
    line = serializers.CharField(help_text="'3 of 12 match (memory 8, price 1)'.")


class PlanStalenessGuidanceSerializer(serializers.Serializer):
    staleness = serializers.IntegerField(help_text="S, the job's staleness budget.")
    correction = serializers.CharField(help_text="The job's loss.off_policy.")
    verdict = serializers.ChoiceField(choices=["good", "slow", "unstable", "unmeasured"], help_text=(
        "What was measured for this S and correction (dataplane/staleness_evidence.py)."))
    figure = serializers.CharField(allow_null=True, help_text="The measured figure; null where nothing was measured.")
    source = serializers.CharField(allow_null=True, help_text="Which measurement.")
    better = serializers.ListField(child=serializers.CharField(), help_text="Corrections measured good at this S.")
    synchronous = serializers.CharField(help_text="The synchronous reference the figures compare against.")
    see = serializers.CharField(help_text="Where the measured table is.")
    warning = serializers.CharField(allow_null=True, help_text="Set where the region was measured unstable.")


class CapacityPlanSerializer(serializers.Serializer):
    measurements = PlanMeasurementsSerializer()
    active = serializers.ListField(child=serializers.IntegerField(), help_text="Ids of the job's active workers.")
    unmeasured = PlanUnmeasuredSerializer(many=True, help_text="Available workers with no throughput figure.")
    report = PlanReportSerializer()
    plan = PlanSelectionSerializer(allow_null=True, help_text="Cheapest set meeting the target (exact solver).")
    greedy = PlanSelectionSerializer(allow_null=True, help_text="The paper's greedy by unit cost, for comparison.")
    calibration = PlanCalibrationSerializer(allow_null=True, help_text="Without T_train: every available worker.")
    requirements = PlanRequirementsSerializer(allow_null=True, help_text="Who meets the job's requirements, and "
                                              "why the others do not.")
    staleness_guidance = PlanStalenessGuidanceSerializer(help_text=(
        "What learning under staleness measured for the job's S and loss.off_policy; its warning is set where "
        "the region was found unstable."))
