#!/bin/sh
# The TLS certificates of the streams' Redis (docker/compose.yaml, service `streams`): a CA of your own and a server
# certificate for `streams` (the name inside compose) and STREAMS_PUBLIC_HOST (the name learners dial; default
# localhost). Written once into TLS_DIR (default docker/tls/, kept out of git); an existing one is left alone.
# Learners check the server against tls/ca.crt (echo2-learner --redis-ca); hand it to job owners.
set -eu
dir="${TLS_DIR:-$(dirname "$0")/tls}"
host="${STREAMS_PUBLIC_HOST:-localhost}"
if [ -f "$dir/streams.crt" ]; then
    echo "$dir/streams.crt exists; delete $dir to make new certificates" >&2
    exit 0
fi
mkdir -p "$dir"
case "$host" in
    *[!0-9.]*) alt="DNS:$host" ;;  # a name
    *) alt="IP:$host" ;;           # an IPv4 address
esac
openssl req -x509 -new -nodes -newkey rsa:3072 -sha256 -days 3650 -subj "/CN=echo2 streams CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -new -nodes -newkey rsa:3072 -subj "/CN=streams" -keyout "$dir/streams.key" -out "$dir/streams.csr" \
    2>/dev/null
printf 'subjectAltName=DNS:streams,%s\nextendedKeyUsage=serverAuth\n' "$alt" > "$dir/streams.ext"
openssl x509 -req -in "$dir/streams.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
    -sha256 -extfile "$dir/streams.ext" -out "$dir/streams.crt" 2>/dev/null
rm -f "$dir/streams.csr" "$dir/streams.ext" "$dir/ca.srl"
chmod 600 "$dir/ca.key"
chmod 644 "$dir/streams.key"  # read by the redis user inside its container (the folder is mounted read-only)
echo "certificates for streams and $host in $dir (give job owners $dir/ca.crt)"
