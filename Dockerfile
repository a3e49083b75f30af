# The offset-ledger API and CLI (docker-compose.yml's "api" service). The image needs no Java:
# Spark jobs run elsewhere and only the ledger and Kafka's admin API are reached from here.
# `pip install '.[server]'` brings the API and console, and no PySpark: only the listener needs it
# ([spark] extra).
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    OFFSET_LEDGER_HOME=/var/lib/offset-ledger

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY offset_ledger ./offset_ledger
RUN pip install '.[server]' && rm -rf /src \
    && useradd --system --uid 10001 --home-dir /var/lib/offset-ledger --create-home offset-ledger

USER offset-ledger
WORKDIR /var/lib/offset-ledger
EXPOSE 9090
CMD ["offset-ledger", "serve", "--host", "0.0.0.0"]
