"""A job's settings as a job file (``GET /api/jobs/{id}/spec/``): TOML or YAML, chosen by ``?format=`` or the
Accept header, written by dataplane.jobfiles so that what is downloaded is what ``echo2 job submit`` reads."""

from __future__ import annotations

import json

from rest_framework.renderers import BaseRenderer
from rest_framework.utils.encoders import JSONEncoder

from dataplane.jobfiles import dump_toml, dump_yaml


def _plain(data) -> dict:
    """``data`` as plain JSON values: an error reply holds DRF's ``ErrorDetail`` strings, which YAML cannot write."""
    return json.loads(json.dumps(data or {}, cls=JSONEncoder))


class TomlRenderer(BaseRenderer):
    media_type = "application/toml"
    format = "toml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return dump_toml(_plain(data)).encode()


class YamlRenderer(BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return dump_yaml(_plain(data)).encode()
