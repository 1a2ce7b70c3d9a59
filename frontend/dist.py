"""The agent's wheel, served by the site itself: providers `pip install` it from here, with no public index.

`make install` and the site's Docker image build it (``scripts/build-wheel.sh``) into ``ECHO2_DIST_DIR``
(default ``var/dist`` in the checkout). The site serves every wheel of ours found there under its own name,
``/dist/echo2-<version>-py3-none-any.whl`` (pip reads the version from that name, so the install line must use
it), and ``/dist/echo2-agent.whl`` redirects to the newest, a stable address for scripts and people. The
directory is looked at on every request: a wheel built while the site runs is served without a restart.
A wheel installs the base package, which is the agent alone (no Django): ``pyproject.toml``'s dependencies.
The owner's CLI alone (``echo2_cli-<version>-py3-none-any.whl``, no torch) is served by its exact name too.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponseNotFound, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_safe

log = logging.getLogger("echo2.site")

WHEEL = re.compile(r"^echo2-(?P<version>[0-9][0-9A-Za-z.!+_]*)-py3-none-any\.whl$")
"""Our wheel's file name (PEP 427: name, version, and the pure-Python tags setuptools gives this project)."""
CLI_WHEEL = re.compile(r"^echo2_cli-(?P<version>[0-9][0-9A-Za-z.!+_]*)-py3-none-any\.whl$")
"""The owner's CLI alone (packaging/echo2-cli: no torch), built beside the agent's wheel and served the same way."""
ALIAS = "echo2-agent.whl"
CONTENT_TYPE = "application/zip"  # a wheel is a ZIP archive (PEP 427); IANA has no type of its own for it


def dist_dir() -> Path:
    return Path(settings.ECHO2["DIST_DIR"])


def wheels() -> list[Path]:
    """Our wheels in the dist directory, oldest version first (none when the directory is missing)."""
    try:
        found = [p for p in dist_dir().iterdir() if WHEEL.match(p.name) and p.is_file()]
    except OSError:
        return []
    return sorted(found, key=lambda p: _version_key(WHEEL.match(p.name)["version"]))


def newest_wheel() -> Path | None:
    found = wheels()
    return found[-1] if found else None


def _version_key(version: str) -> tuple:
    """Sort key of a version: packaging's rules where it is installed (transformers brings it), else numeric."""
    try:
        from packaging.version import InvalidVersion, Version

        try:
            return (1, Version(version))
        except InvalidVersion:
            return (0, version)
    except ImportError:  # pragma: no cover - packaging comes with the base install's transformers
        return (1, tuple(int(p) if p.isdigit() else 0 for p in version.split(".")))


def missing_reason() -> str:
    return (f"this site has no agent wheel to offer: none was built into {dist_dir()} (ECHO2_DIST_DIR). "
            "Its operator builds one with `make install` or scripts/build-wheel.sh.")


@require_safe
def wheel(request, filename: str) -> HttpResponse:
    """One of our wheels by its exact file name; a 404 says why (no wheel at all, or not that version)."""
    found = {p.name: p for p in wheels()}
    cli = dist_dir() / filename
    if CLI_WHEEL.match(filename) and cli.is_file():
        return FileResponse(cli.open("rb"), as_attachment=True, filename=filename, content_type=CONTENT_TYPE)
    if filename not in found:
        if not found:
            return HttpResponseNotFound(missing_reason() + "\n", content_type="text/plain")
        return HttpResponseNotFound(f"no wheel {filename} here; this site serves {', '.join(sorted(found))} "
                                    f"(newest: /dist/{ALIAS})\n", content_type="text/plain")
    return FileResponse(found[filename].open("rb"), as_attachment=True, filename=filename, content_type=CONTENT_TYPE)


@require_safe
def wheel_alias(request) -> HttpResponse:
    """``/dist/echo2-agent.whl``: a redirect (302: it moves with every build) to the newest wheel."""
    newest = newest_wheel()
    if newest is None:
        return HttpResponseNotFound(missing_reason() + "\n", content_type="text/plain")
    return HttpResponseRedirect(reverse("frontend:dist-wheel", args=[newest.name]))


def install_context(request) -> dict[str, str | None]:
    """What the provider page shows: the exact line a provider runs on their machine (``pip_command``), with
    absolute URLs built from this request, so they name the host and scheme the provider reached the site by;
    all None when no wheel was built."""
    newest = newest_wheel()
    if newest is None:
        return {"pip_command": None, "wheel_url": None, "wheel_alias": None}
    url = request.build_absolute_uri(reverse("frontend:dist-wheel", args=[newest.name]))
    return {"pip_command": f'pip install "{url}"', "wheel_url": url,
            "wheel_alias": request.build_absolute_uri(reverse("frontend:dist-alias"))}


def log_startup() -> None:
    """One line when the site starts: which wheel providers get, or that they get none and how to fix it."""
    newest = newest_wheel()
    if newest is None:
        log.warning("agent wheel: %s /dist/%s answers 404 until then.", missing_reason(), ALIAS)
    else:
        log.info("agent wheel: serving %s at /dist/%s (and /dist/%s)", newest, newest.name, ALIAS)
