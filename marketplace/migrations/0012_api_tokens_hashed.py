"""API tokens are stored hashed: each plain-text token of Django REST framework's authtoken table becomes a knox
token holding only its sha512 (the same string keeps working), and the plain-text rows are deleted.

The authtoken app is no longer installed, so its table is read with SQL when it exists (a database made before).
Reversing leaves the hashed tokens in place: the plain text cannot be recovered.
"""

from django.db import migrations


def _aware(value):
    """SQLite's raw cursor gives naive UTC datetimes (or text); PostgreSQL aware ones."""
    from datetime import UTC

    from django.utils.dateparse import parse_datetime

    value = parse_datetime(value) if isinstance(value, str) else value
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def hash_plain_tokens(apps, schema_editor):
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    AuthToken = apps.get_model("knox", "AuthToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        token = AuthToken(digest=hash_token(key), token_key=key[:CONSTANTS.TOKEN_KEY_LENGTH], user_id=user_id,
                          expiry=None)
        token.save(force_insert=True)
        AuthToken._base_manager.filter(pk=token.pk).update(created=_aware(created))  # auto_now_add ignored the old date
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0011_base_snapshot"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop)]
