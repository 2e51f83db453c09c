#!/bin/sh
# The container's entry point (Containerfile): k3 serve on 0.0.0.0, port $K3_PORT (8000),
# which opens the API to the network, so an API key is required: K3_API_KEY, which k3 serve
# reads itself (Authorization: Bearer KEY). Arguments: the model (a snapshot folder, or a name
# such as moonshotai/Kimi-K3; /models, the volume, when the arguments start with a flag or
# there are none) and more k3 serve flags.
set -eu
if [ -z "${K3_API_KEY:-}" ]; then
    echo "k3 container: set K3_API_KEY (e.g. -e K3_API_KEY=\$(openssl rand -hex 16)): k3 serve" \
         "listens on 0.0.0.0 here, open to the network" >&2
    exit 2
fi
case "${1:-}" in "" | -*) set -- /models "$@" ;; esac
exec k3 serve "$@" --host 0.0.0.0 --port "${K3_PORT:-8000}"
