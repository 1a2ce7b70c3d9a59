"""The API's JSON parser: DRF's, plus the limits of :mod:`marketplace.infra.jsonlimits`, so that JSON nested 100 000
deep or a NUL character in a string (PostgreSQL stores neither) is a 400 naming where, never a 500."""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

from ..infra.jsonlimits import JSONLimitError, check_json, max_depth


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {max_depth()} levels") from None
        try:
            check_json(data, forbid_nul=True)
        except JSONLimitError as err:
            raise ValidationError({err.path or "body": [err.reason]}) from None
        return data
