# The node-agent image for `%%cluster --backend kubernetes --image IMAGE`.
#
# Each gang pod runs `python -m jupyter_mn.node.pod` from this image: one dask worker hosting the
# node agent (pod 0 also the dask scheduler), which starts one rank process per GPU. So the image
# needs Python, the CUDA build of torch you train with, jupyter_mn, and, for --rdma, the verbs
# libraries NCCL loads for InfiniBand/RoCE. Keep torch and jupyter_mn at the versions the notebook
# kernel uses: cells are pickled in the kernel and run here.
#
# Build from the repository root and push where the cluster can pull from:
#   docker build -f docs/agent.Dockerfile -t registry.example/jupyter-mn-agent:0.1.0 .
#   docker push registry.example/jupyter-mn-agent:0.1.0
# Other torch/CUDA builds: --build-arg TORCH=2.13.0 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128

FROM python:3.11-slim

ARG TORCH=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

# libibverbs + the mlx5/efa providers: without them NCCL silently falls back to TCP sockets.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers librdmacm1 \
 && rm -rf /var/lib/apt/lists/*

RUN pip install --no-cache-dir "torch==${TORCH}" --index-url "${TORCH_INDEX}"

COPY . /src/jupyter_mn
RUN pip install --no-cache-dir /src/jupyter_mn && rm -rf /src

ENV PYTHONUNBUFFERED=1
# The agent runs as this non-root user (uid 1000, the pods' runAsUser), so the pods pass the
# "restricted" Pod Security Standard. With --rdma the pods run as root instead, holding only
# CAP_IPC_LOCK: Kubernetes grants an added capability to root only, and verbs needs it to pin
# memory beyond the memlock limit. /workspace is writable for both (sticky, like /tmp).
RUN useradd --uid 1000 --user-group --create-home --home-dir /home/agent agent \
 && install -d -m 1777 -o 1000 -g 1000 /workspace
USER 1000:1000
WORKDIR /workspace
CMD ["python", "-m", "jupyter_mn.node.pod"]
