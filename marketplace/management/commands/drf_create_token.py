"""``manage.py drf_create_token USER [-r]``: print a new API token for USER, once (only its hash is stored).

It keeps the name and output of Django REST framework's command it replaces, so scripts that parse
``Generated token <key> for user <name>`` go on working.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from marketplace import services


class Command(BaseCommand):
    help = "Create an API token for a user and print it (it is shown only this once)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username", help="The user the token authenticates.")
        parser.add_argument("-r", "--reset", action="store_true", dest="reset",
                            help="Revoke the user's other tokens (default: they keep working).")

    def handle(self, *args, username: str, reset: bool, **options) -> None:
        user = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"Cannot create the Token: user {username} does not exist")
        token = services.api_token_issue(user=user, replace=reset)
        self.stdout.write(f"Generated token {token} for user {username}")
