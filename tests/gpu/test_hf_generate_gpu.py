"""A Hugging Face Llama sparsified and generating, as a user would run it: greedy `generate`
eager, then with a static KV cache and its forward compiled (fullgraph; not mode="reduce-overhead":
transformers 5.17's static cache mutates an input, so Inductor skips CUDA graphs there, and the
dense model itself crashed the process that way on torch 2.11: LOG, session 42). Every step's logits are checked against the float64 dense
model of the same pruned weights, fed the same tokens (teacher forcing), so near-tied tokens
that fp16 may flip do not make the test flaky."""
import copy

import pytest
import torch

import spartune as st
from helpers import finite_rel_err as rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_cache")]
transformers = pytest.importorskip("transformers")

TOL = 2e-2


def llama(seed=0):
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def densified(sparse, dense):
    """`dense` (a copy of the model before sparsify) given the pruned weights, in float64."""
    for name, m in sparse.named_modules():
        if isinstance(m, st.SparseLinear):
            dense.get_submodule(name).weight.data.copy_(m.weight.to_dense())
    return dense.double()


def generated_logits(model, ids, steps):
    # every prompt token attended (a token equal to pad_token_id would otherwise be masked out of
    # the prompt, and the float64 reference reads it) and no early stop at an end-of-sequence token
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)


def reference_logits(reference, sequences, prompt, steps):
    with torch.no_grad():
        return reference(sequences[:, :-1]).logits[:, prompt - 1: prompt - 1 + steps]


@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.9), ("2:4", None), ("block:64", 0.75), ("64:2:8", None)])
def test_llama_generates_eager_and_compiled_with_a_static_cache(pattern, sparsity):
    model = llama().to("cuda", torch.float16)
    dense = copy.deepcopy(model)
    st.sparsify(model, {"*.layers.*": pattern if sparsity is None else (pattern, sparsity)})
    assert isinstance(model.model.layers[0].mlp.up_proj, st.SparseLinear)
    reference = densified(model, dense)
    prompt, steps = 9, 12
    ids = torch.randint(0, 512, (2, prompt), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        sequences, logits = generated_logits(model, ids, steps)  # eager: tunes prefill and decode
    assert rel_err(logits, reference_logits(reference, sequences, prompt, steps)) < TOL
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, fullgraph=True)
    for seed in (2, 3):  # the second call reuses the first's graphs
        ids = torch.randint(0, 512, (2, prompt), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            sequences, logits = generated_logits(model, ids, steps)
        assert sequences.shape == (2, prompt + steps)
        assert rel_err(logits, reference_logits(reference, sequences, prompt, steps)) < TOL, seed
