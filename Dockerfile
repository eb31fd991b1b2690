# Hooklane's container image: one image for every role.
#
#   hack/image                                  # this machine, no registry needed (debootstrap base)
#   docker build --build-arg VERSION=X.Y.Z -t hooklane:X.Y.Z .     # anywhere else (X.Y.Z: pyproject.toml's)
#
#   podman run IMAGE migrate | worker | operator | status | publish ... | endpoint ...
#
# At run time:
# - the user is uid/gid 10001 (no name is needed: any uid works);
# - the root filesystem may be read-only: nothing is written but to /tmp
#   (HOME and TMPDIR), which must then be writable: an emptyDir in
#   Kubernetes, `--tmpfs /tmp` with podman/docker. Bytecode is compiled at
#   build time and never written (PYTHONDONTWRITEBYTECODE);
# - tini is PID 1 and passes SIGTERM on to hooklane, so a worker drains its
#   deliveries in flight and exits 0 (give it terminationGracePeriodSeconds
#   above HOOKLANE_DRAIN_SECONDS, 70 by default);
# - the worker serves metrics and probes on 9100 (HOOKLANE_METRICS_PORT).
#
# Both stages use the same base, so the interpreter the virtualenv points at
# (/usr/local/bin/python3 in the official images, /usr/bin/python3 in Debian's)
# exists in the final image.

ARG BASE_IMAGE=python:3.11-slim-bookworm

# Dependencies, in a layer of their own: rebuilt only when pyproject.toml
# changes. pip has a virtualenv of its own (/opt/pip) that only the build
# uses: the application's (/opt/hooklane) has no pip or setuptools.
FROM ${BASE_IMAGE} AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/pip \
 && python3 -m venv --without-pip /opt/hooklane
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /src/requirements.txt \
 && /opt/pip/bin/pip --python /opt/hooklane/bin/python install --no-compile --prefer-binary -r /src/requirements.txt \
 && /opt/hooklane/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/hooklane

# The hooklane wheel, built from the context (never an editable install),
# checked for its SQL files and installed once here to check it fits the
# dependencies.
FROM deps AS build
COPY pyproject.toml README.md LICENSE /src/
COPY hooklane /src/hooklane
RUN /opt/pip/bin/pip wheel --no-deps --wheel-dir /wheels /src \
 && /opt/hooklane/bin/python -c 'import glob, sys, zipfile; \
names = zipfile.ZipFile(glob.glob("/wheels/hooklane-*.whl")[0]).namelist(); \
sql = [n for n in names if n.startswith("hooklane/store/") and n.endswith(".sql")]; \
print("SQL files in the wheel:", *sql); \
sys.exit(not ("hooklane/store/queries.sql" in sql and any("/migrations/" in n for n in sql)))' \
 && /opt/pip/bin/pip --python /opt/hooklane/bin/python install --no-deps --no-index /wheels/hooklane-*.whl \
 && /opt/pip/bin/pip --python /opt/hooklane/bin/python check

FROM ${BASE_IMAGE}
ARG VERSION=0.0.0+unknown
# Where the source lives; hack/image passes the git remote when there is one.
ARG SOURCE=https://github.com/hooklane/hooklane
LABEL org.opencontainers.image.title="hooklane" \
      org.opencontainers.image.description="Webhook delivery for multi-tenant platforms on Kubernetes: operator, worker, migrate, status and publish in one image" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# The official images ship the standard library without bytecode (Debian's
# has it already: compileall then writes nothing).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb /var/log/apt /var/log/dpkg.log \
 && groupadd --gid 10001 hooklane \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin hooklane \
 && python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"

COPY --from=deps /opt/hooklane /opt/hooklane
# pip is bind-mounted from the build stage, so it takes no room in the image.
# The wheel is copied, not mounted: a mount's content is not part of the
# layer cache key (podman reused a stale layer), a copied file is.
COPY --from=build /wheels/ /tmp/wheels/
RUN --mount=type=bind,from=build,source=/opt/pip,target=/opt/pip \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 \
    /opt/pip/bin/pip --python /opt/hooklane/bin/python install --no-deps --no-index --no-compile /tmp/wheels/hooklane-*.whl \
 && rm -rf /tmp/wheels \
 && /opt/hooklane/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/hooklane/lib/python3*/site-packages/hooklane

ENV PATH=/opt/hooklane/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    LANG=C.UTF-8
USER 10001:10001
WORKDIR /tmp
EXPOSE 9100
ENTRYPOINT ["tini", "--", "hooklane"]
CMD ["--help"]
