"""The ledger (docs/ledger.md): every billed interval one immutable row, and every price a worker had, with its date.

Balances, provider statements and owner invoices are queries over :class:`LedgerEntry` (``marketplace.reads.ledger``);
the running sums the pages show (``Activation.billed_usd``) are written in the same transaction as each row, so
they equal the ledger's sums to the cent (tests/marketplace/test_ledger.py proves it over a run).
Imported by ``marketplace.models`` (Django finds the models there).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

AMOUNT_PLACES = 9
"""An entry's amount is kept to 1e-9 USD: a two-second interval at $0.35/h is $0.000194..., so rounding each to the
cent would bill nothing; totals are rounded to the cent once, when shown (``marketplace.core.billing.cents``)."""


class LedgerError(ValueError):
    """A ledger row was to be changed or deleted: entries are immutable (a correction is a new entry)."""


class LedgerEntry(models.Model):
    """One billed interval of one activation: ``seconds`` in ``state`` ending at ``at``, at ``rate`` USD/h.

    Worker, job and provider are kept by id and by name, so a statement still reads after a worker is removed
    (it is only unregistered) or a job archived."""

    worker = models.ForeignKey("marketplace.Worker", on_delete=models.SET_NULL, null=True, related_name="ledger")
    job = models.ForeignKey("marketplace.Job", on_delete=models.SET_NULL, null=True, related_name="ledger")
    activation = models.ForeignKey("marketplace.Activation", on_delete=models.SET_NULL, null=True,
                                   related_name="ledger")
    provider = models.ForeignKey("marketplace.Provider", on_delete=models.SET_NULL, null=True, related_name="ledger")
    owner = models.ForeignKey("auth.User", on_delete=models.SET_NULL, null=True, related_name="ledger")
    worker_name = models.CharField(max_length=100)
    job_name = models.CharField(max_length=100)
    state = models.CharField(max_length=16, help_text="What the site observed the worker do (billed states: "
                             "installing, generating; 'opening' for time billed before the ledger existed).")
    started_at = models.DateTimeField(help_text="Start of the interval.")
    at = models.DateTimeField(db_index=True, help_text="End of the interval: when it was billed.")
    seconds = models.DecimalField(max_digits=16, decimal_places=6)
    rate = models.DecimalField(max_digits=10, decimal_places=4, help_text="USD per hour in force for the interval.")
    amount = models.DecimalField(max_digits=20, decimal_places=AMOUNT_PLACES, help_text="USD: seconds x rate / 3600.")

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"]), models.Index(fields=["worker", "at"])]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise LedgerError("ledger entries are immutable")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise LedgerError("ledger entries are immutable")


class PriceChange(models.Model):
    """A worker's price from ``at`` on (its first row: the price it registered with)."""

    worker = models.ForeignKey("marketplace.Worker", on_delete=models.CASCADE, related_name="prices")
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]
