"""The sign-in forms (the site's and the admin's) with the username's length checked before anything looks it up.

Django's ``AuthenticationForm`` sets only the widget's ``maxlength`` from the user model: a longer name went on to
``authenticate``, and django-axes, recording the failure, wrote it into its 255-character column: a 500 on
PostgreSQL. Here it is a field error like any other, and nothing is looked up or recorded."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.validators import MaxLengthValidator


def _bounded(form: AuthenticationForm) -> None:
    field = form.fields["username"]
    if field.max_length and not any(isinstance(v, MaxLengthValidator) for v in field.validators):
        field.validators.append(MaxLengthValidator(field.max_length))


class SignInForm(AuthenticationForm):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _bounded(self)


class AdminSignInForm(AdminAuthenticationForm):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _bounded(self)
