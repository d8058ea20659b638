"""Receipt signing keys: Ed25519, the private half encrypted like every other secret."""

from __future__ import annotations

from django.db import models


class SigningKeyQuerySet(models.QuerySet["SigningKey"]):
    def active(self) -> SigningKeyQuerySet:
        """Keys that may sign: not retiring. The newest of them signs."""
        return self.filter(retires_at__isnull=True).order_by("-created_at", "-pk")


class SigningKey(models.Model):
    """One Ed25519 key pair. `retires_at` set: rotated out, it signs nothing from then on
    and its receipts verify only if signed before then (apps/receipts/keys.py)."""

    kid = models.CharField(max_length=64, unique=True)
    public_x = models.CharField(max_length=64, help_text="The public key (JWK `x`).")
    # Fernet, with TOOLHUB_ENCRYPTION_KEY (apps.connections.crypto), as connection secrets.
    private_key_encrypted = models.TextField()
    created_at = models.DateTimeField()
    retires_at = models.DateTimeField(null=True, blank=True)

    objects = SigningKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.kid


class DecisionReceipt(models.Model):
    """The signed receipt of a held call's decision (approved, edited, rejected, expired,
    cancelled), made in the decision's transaction: who voted what, on which arguments.
    An approved call cancelled before it ran has two."""

    approval = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="decision_receipts"
    )
    receipt = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"decision receipt of {self.approval_id}"
