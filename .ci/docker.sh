#!/usr/bin/env bash
# Sets up Docker for the tests in tests/docker, as DESIGN.md says: Debian's docker.io (and
# docker-compose 1.29 for the compose checks), a dockerd without a bridge network or iptables rules
# (containers and builds use the host's network), and the local python:3.11-slim base image that
# make-python-base.sh builds from Debian packages (no registry can be pulled from here); then it
# builds deploy/Dockerfile's two targets once, so that the tests find the layers cached.
#
# Idempotent: each step is skipped when its result is already there. Every step is timed on stderr.
# Run from anywhere: bash .ci/docker.sh. Needs root (apt-get, dockerd).
#
# The base-image script is looked for at $CORRAL_BASE_IMAGE_SCRIPT, then ../shared/tools/ next to the
# repository, then /work/shared/tools/; without one, deploy/base-image.sh builds the stand-in.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/corral-ci-dockerd.log}
DOCKERD_WAIT_SEC=${DOCKERD_WAIT_SEC:-60}

step_start=0
step() { step_start=$(date +%s); echo "[ci/docker] $(date +%T) $*" >&2; }
done_step() { echo "[ci/docker] $(date +%T) ... $1 in $(( $(date +%s) - step_start ))s" >&2; }

# 1. packages
need=()
{ command -v dockerd >/dev/null || [ -x /usr/sbin/dockerd ]; } || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  step "apt-get install ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  done_step "packages"
fi

# 2. the daemon
if ! docker info >/dev/null 2>&1; then
  step "starting dockerd (--bridge=none --iptables=false --ip6tables=false), log $DOCKERD_LOG"
  nohup "$(command -v dockerd || echo /usr/sbin/dockerd)" --bridge=none --iptables=false --ip6tables=false \
    >"$DOCKERD_LOG" 2>&1 &
  deadline=$(( $(date +%s) + DOCKERD_WAIT_SEC ))
  until docker info >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "[ci/docker] dockerd did not answer within ${DOCKERD_WAIT_SEC}s; its log:" >&2
      tail -n 40 "$DOCKERD_LOG" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  done_step "dockerd"
fi

# 3. the base image of deploy/Dockerfile
if ! docker image inspect python:3.11-slim >/dev/null 2>&1; then
  script=""
  for candidate in "${CORRAL_BASE_IMAGE_SCRIPT:-}" "$ROOT/../shared/tools/make-python-base.sh" \
                   /work/shared/tools/make-python-base.sh; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then script=$candidate; break; fi
  done
  if [ -z "$script" ]; then
    # Not on this machine: our own builder makes the same stand-in from Debian packages.
    script="$ROOT/deploy/base-image.sh"
  fi
  step "building python:3.11-slim with $script"
  bash "$script" python:3.11-slim
  done_step "base image"
fi

# 4. warm the layer cache of deploy/Dockerfile (both targets), so that the tests' image fixtures
# (tests/docker/conftest.py, the same classic builder through the Docker API) only add their label.
# DOCKER_BUILDKIT=0: BuildKit keeps a cache of its own, which the API's builds would not see.
if [ "${CORRAL_CI_PREBUILD:-1}" = 1 ]; then
  for target in control worker; do
    step "docker build --target $target (deploy/Dockerfile)"
    log="/tmp/corral-ci-build-$target.log"
    if ! DOCKER_BUILDKIT=0 docker build --network host --force-rm -f "$ROOT/deploy/Dockerfile" \
        --target "$target" -t "corral-$target:ci" "$ROOT" >"$log" 2>&1; then
      echo "[ci/docker] docker build --target $target failed; the end of $log:" >&2
      tail -n 60 "$log" >&2
      exit 1
    fi
    done_step "image $target"
  done
fi
echo "[ci/docker] $(date +%T) ready: $(docker version --format 'docker {{.Server.Version}}'), base image python:3.11-slim" >&2
