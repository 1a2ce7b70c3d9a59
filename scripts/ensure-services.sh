#!/usr/bin/env bash
# Make sure what the tests need is here: Redis (running), Chromium, and PostgreSQL when DATABASE_URL names it.
# Installs Debian's packages when the binaries are missing. With --redis-binary-only it only makes
# sure redis-server is installed (the demo starts its own private instance).
set -euo pipefail

apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "ensure-services: $* missing and apt-get unavailable; install it by hand" >&2; exit 1
  fi
  [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq >/dev/null; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

command -v redis-server >/dev/null || apt_install redis-server
[ "${1:-}" = "--redis-binary-only" ] && exit 0

# The browser tests drive Debian's Chromium (Playwright's own browser download cannot work offline).
if ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "ensure-services: installing chromium for the browser tests"
    apt_install chromium
  else
    echo "ensure-services: no chromium and no apt-get: the browser tests will be skipped" >&2
  fi
fi

# axe-core (npm) checks the browser tests' pages for accessibility; installed under var/ (ignored), never committed.
AXE_VERSION=4.14.1
axe_dir="$(cd "$(dirname "$0")/.." && pwd)/var/node"
if [ ! -f "$axe_dir"/node_modules/axe-core/axe.min.js ]; then
  if command -v npm >/dev/null; then
    echo "ensure-services: installing axe-core $AXE_VERSION for the browser tests"
    npm install --prefix "$axe_dir" --no-save --no-audit --no-fund -s "axe-core@$AXE_VERSION" >/dev/null \
      || echo "ensure-services: npm could not install axe-core: the accessibility checks will be skipped" >&2
  else
    echo "ensure-services: no npm: the browser tests' accessibility checks will be skipped" >&2
  fi
fi

redis_url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
redis_port=$(python3 -c "import sys,urllib.parse as u; print(u.urlsplit(sys.argv[1]).port or 6379)" "$redis_url")
if ! redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
  echo "ensure-services: starting redis-server on 127.0.0.1:$redis_port"
  mkdir -p /tmp/echo2-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
    --dir /tmp/echo2-redis --logfile /tmp/echo2-redis/redis.log
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

case "${DATABASE_URL:-}" in
  postgres*|postgresql*)
    if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
      echo "ensure-services: starting PostgreSQL"
      if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
      else
        echo "ensure-services: PostgreSQL is not installed here; unset DATABASE_URL to test on SQLite" >&2; exit 1
      fi
      for _ in $(seq 100); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 0.1; done
    fi
    ;;
esac
