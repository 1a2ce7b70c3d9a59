"""Samples on the API: the rows a learner's step report may carry (bounded, validated field by field) and
``GET /api/jobs/<id>/samples/`` (docs/learner.md "Samples", docs/cli.md)."""

from __future__ import annotations

from rest_framework import serializers

from dataplane import samples

from ..models import JobSample

MAX_INT = 2**31 - 1
MAX_REWARD = 1e12


class SampleRowSerializer(serializers.Serializer):
    """One sample as the learner reports it. NUL characters are refused (DRF's CharField), texts are bounded."""

    step = serializers.IntegerField(min_value=1, max_value=MAX_INT)
    version = serializers.IntegerField(min_value=0, max_value=MAX_INT)
    worker = serializers.IntegerField(min_value=0, max_value=MAX_INT)
    reward = serializers.FloatField(min_value=-MAX_REWARD, max_value=MAX_REWARD)
    prompt = serializers.CharField(max_length=samples.PROMPT_CHARS, allow_blank=True, trim_whitespace=False)
    completion = serializers.CharField(max_length=samples.COMPLETION_CHARS, allow_blank=True, trim_whitespace=False)


def sample_rows_field() -> serializers.Field:
    return SampleRowSerializer(many=True, required=False, default=list, max_length=samples.MAX_SAMPLES_PER_REPORT,
                               help_text="A few records the step trained (every N-th step; the site keeps a job's "
                                         f"newest {samples.SAMPLES_KEPT_PER_JOB}).")


class SampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobSample
        fields = ["step", "version", "worker", "reward", "prompt", "completion", "created_at"]


class SampleQuerySerializer(serializers.Serializer):
    """``GET /api/jobs/<id>/samples/``: the newest first, optionally within a reward range."""

    min_reward = serializers.FloatField(required=False, allow_null=True, default=None,
                                        help_text="Only samples whose reward is at least this.")
    max_reward = serializers.FloatField(required=False, allow_null=True, default=None,
                                        help_text="Only samples whose reward is at most this.")
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=samples.SAMPLES_KEPT_PER_JOB,
                                     help_text="How many (the newest).")

    def validate(self, attrs: dict) -> dict:
        low, high = attrs.get("min_reward"), attrs.get("max_reward")
        if low is not None and high is not None and low > high:
            raise serializers.ValidationError({"min_reward": f"{low} is above max_reward {high}"})
        return attrs
