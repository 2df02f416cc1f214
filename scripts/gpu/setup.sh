#!/usr/bin/env bash
# Source this at the start of every GPU call (`. scripts/gpu/setup.sh`), from the repo root.
# It reassembles the default target from the two halves carried in consecutive calls
# (see ../shared/gpu/stage-target.sh), installs the carried wheels, and prepares SmolLM2 as an HF
# folder once per machine. Afterwards: $EAGLEKIT_SMOLLM2_DIR is the prepared folder (if both halves
# have arrived), PYTHONPATH holds eaglekit's src.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STAGE=/root/stage
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$STAGE"
[[ -f .device/p1/part.aa ]] && cp -n .device/p1/part.aa "$STAGE/"
[[ -f .device/p2/part.ab ]] && cp -n .device/p2/part.ab "$STAGE/"
if compgen -G ".device/whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if [[ ! -f $GGUF && -f $STAGE/part.aa && -f $STAGE/part.ab ]]; then
  cat "$STAGE/part.aa" "$STAGE/part.ab" > "$GGUF"
fi
export EAGLEKIT_SMOLLM2_DIR=/root/smollm2-hf
if [[ -f $GGUF && ! -f $EAGLEKIT_SMOLLM2_DIR/config.json ]]; then
  python3 -m eaglekit target prepare --target "$GGUF" --out "$EAGLEKIT_SMOLLM2_DIR" --overwrite 2>&1 | grep -v "Convert\|Loading weights" | tail -3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
