# Roost broker image. Used by docker-compose.yml for the 3-member cluster in
# configs/compose3.toml (and docker-compose.partitioned.yml); see docs/docker.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Install the project (non-editable), then drop the sources.
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir . \
    && cd / \
    && rm -rf /src

# Non-root user. The data directories exist in the image, owned by that user,
# so a fresh named volume mounted on one of them inherits that ownership
# (Docker copies the mount point's contents and owner into an empty volume).
RUN groupadd --system --gid 10001 roost \
    && useradd --system --uid 10001 --gid roost --home-dir /var/lib/roost \
        --no-create-home --shell /usr/sbin/nologin roost \
    && mkdir -p /etc/roost \
        /var/lib/roost/run/data/n1 /var/lib/roost/run/data/n2 /var/lib/roost/run/data/n3 \
        /var/lib/roost/run/data/n4 /var/lib/roost/run/data/n5 \
    && chown -R roost:roost /var/lib/roost

# Relative data_dir values in the config (run/data/<id>) resolve against this.
WORKDIR /var/lib/roost
USER roost

# Client ports (UDP), peer ports (TCP) and monitoring ports (HTTP) of configs/compose3.toml and
# configs/compose5-partitioned.toml.
EXPOSE 7401/udp 7402/udp 7403/udp 7411/udp 7412/udp 7413/udp 7414/udp 7415/udp
EXPOSE 7501/tcp 7502/tcp 7503/tcp 7511/tcp 7512/tcp 7513/tcp 7514/tcp 7515/tcp
EXPOSE 8401/tcp 8402/tcp 8403/tcp 8411/tcp 8412/tcp 8413/tcp 8414/tcp 8415/tcp

# The node exits cleanly on SIGTERM (the compose file's stop_signal).
STOPSIGNAL SIGTERM
ENTRYPOINT ["roost"]
CMD ["--help"]
