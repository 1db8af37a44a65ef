# Cachet's image: Daphne serving Cachet as the user "cachet", bubblewrap for sandboxing the run tool.
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CACHET_DATA=/data
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# run executes commands in a bubblewrap sandbox (see README, "What run can reach").
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY cachet cachet
COPY sessions_app sessions_app
COPY chat chat
# with django-auth-ldap for sign-in with LDAP (CACHET_LDAP_URI): python-ldap builds against OpenLDAP's headers
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libldap-dev libsasl2-dev \
    && pip install --no-cache-dir '.[ldap]' \
    && apt-get purge -y gcc libc6-dev libldap-dev libsasl2-dev && apt-get autoremove -y \
    && apt-get install -y --no-install-recommends libldap-2.5-0 libsasl2-2 && rm -rf /var/lib/apt/lists/*
COPY . .
# Cachet's own bytecode, as pip compiled the packages': PYTHONDONTWRITEBYTECODE leaves every process to compile it
# again otherwise (about 2 s of CPU for each web process, worker and manage.py command).
RUN python -m compileall -q manage.py cachet chat sessions_app
RUN useradd --create-home --uid 1000 cachet \
    && mkdir -p /data /workspaces \
    && chown cachet:cachet /data /workspaces
USER cachet
EXPOSE 8000
CMD ["python", "manage.py", "serve", "--host", "0.0.0.0", "--port", "8000"]
