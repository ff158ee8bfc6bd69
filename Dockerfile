# CPU image (works anywhere): every service runs from it with a different command.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 CODESERVE_MODEL_DIR=/models/default-model
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
# The embedded default model is written at build time, so containers start without any download.
RUN python -m worker_svc.model.default --out /models/default-model
EXPOSE 8000
CMD ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8000", "--scheduler", "scheduler:50053", "--model-path", "/models/default-model"]
