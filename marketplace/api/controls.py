"""The bodies of the provider's and owner's controls (docs/ledger.md): a worker's new price, a job's budget."""

from __future__ import annotations

from rest_framework import serializers

from ..services.controls import MAX_PRICE, MIN_PRICE


class PriceSerializer(serializers.Serializer):
    price_per_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=MIN_PRICE,
                                              max_value=MAX_PRICE, help_text="c_i, USD/h, from now on.")


class BudgetSerializer(serializers.Serializer):
    budget_usd = serializers.FloatField(allow_null=True, help_text=(
        "Most the job may spend, USD (null: no cap). A job paused at its budget runs again when the new one leaves "
        "room for its next step."))

    def validate(self, attrs):
        # a misspelt key ("budget": 5) was ignored and the cap set to null: no cap at all
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError({unknown[0]: [f"unknown field; the body is {{\"budget_usd\": USD or "
                                                            f"null}}, got {', '.join(map(repr, unknown))}"]})
        return attrs


def listed(params, name: str) -> bool:
    """``?archived=1`` / ``?removed=1``: lists include archived jobs / removed workers too."""
    return params.get(name, "").lower() in ("1", "true", "yes")
