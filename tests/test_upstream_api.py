"""One test per private API of Transformers (and argparse) hf-posenc relies on (``hf_posenc/upstream.py``).

Run on the locked releases and, in the upstream lane, on the newest ones: a release that moves one of these fails
the test named after it, not a model's numbers."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import DynamicCache, HfArgumentParser, PreTrainedModel, TrainingArguments

import hf_posenc
from hf_posenc import upstream
from hf_posenc.schemes.tape import TapeBlock
from tiny import random_ids, tiny_model

pytestmark = pytest.mark.upstream


def test_every_private_name_of_the_module_is_tested_here():
    public = {n for n, v in vars(upstream).items() if callable(v) and getattr(v, "__module__", "") == upstream.__name__}
    source = open(__file__).read()
    untested = sorted(n for n in public if f"upstream.{n}(" not in source)
    assert not untested, f"hf_posenc/upstream.py functions without a test here: {untested}"


def test_layer_cache_reads_either_keyword_and_refuses_two_caches():
    a, b = DynamicCache(), DynamicCache()
    assert upstream.layer_cache(past_key_values=a) is a and upstream.layer_cache(cache=b) is b
    assert upstream.layer_cache(a, a) is a and upstream.layer_cache() is None
    with pytest.raises(TypeError, match="two different KV caches"):
        upstream.layer_cache(a, b)


def test_the_decoder_layer_receives_the_cache_under_a_keyword_the_module_reads():
    """The stock decoder layer's signature names the keyword the model passes the cache with; hf-posenc's layer
    forward reads every spelling in CACHE_KEYWORDS, so one of them must be the one this release uses."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel

    layer_keywords = set(inspect.signature(LlamaDecoderLayer.forward).parameters)
    assert layer_keywords & set(upstream.CACHE_KEYWORDS), layer_keywords
    passed = inspect.getsource(LlamaModel.forward)
    assert any(f"{kw}={kw}" in passed for kw in upstream.CACHE_KEYWORDS), "the model passes its cache otherwise"


@pytest.mark.parametrize("keyword", upstream.CACHE_KEYWORDS)
def test_tape_layer_reads_the_cache_under_either_keyword(keyword):
    """TAPE's decoder layer given the cache as `cache=` (5.24+) or `past_key_values=` (5.18-5.23) fills it and
    computes what the full pass computes (with trained weights: a lost cache changes the output)."""
    model = hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape")
    g = torch.Generator().manual_seed(0)
    for block in (m for m in model.modules() if isinstance(m, TapeBlock)):
        for p in block.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3
    ids = random_ids(1, 8)
    decoder = model.model
    with torch.no_grad():
        full = decoder(ids).last_hidden_state
        cache = DynamicCache(config=model.config)
        x = decoder.embed_tokens(ids)
        pos = torch.arange(8)[None]
        outs = []
        for lo, hi in ((0, 5), (5, 6), (6, 7), (7, 8)):  # a prefill, then one token at a time against the cache
            h, p = x[:, lo:hi], pos[:, lo:hi]
            rope = decoder.rotary_emb(h, p)
            for layer in decoder.layers:
                h = layer(h, position_ids=p, position_embeddings=rope, use_cache=True, **{keyword: cache})
            outs.append(decoder.norm(h if torch.is_tensor(h) else h[0]))
    assert cache.get_seq_length() == 8
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_attn_implementation_is_the_configs_private_field():
    model = tiny_model("llama", "sdpa")
    assert upstream.attn_implementation(model.config) == "sdpa"
    model.set_attn_implementation("eager")
    assert upstream.attn_implementation(model.config) == "eager"


def test_family_eager_attention_is_a_module_level_function_of_the_family():
    from transformers.models.llama import modeling_llama

    fn = upstream.family_eager_attention(modeling_llama.__name__)
    assert fn is modeling_llama.eager_attention_forward
    assert list(inspect.signature(fn).parameters)[:5] == ["module", "query", "key", "value", "attention_mask"]


def test_supports_attention_backend_flag():
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    assert upstream.supports_attention_backend(LlamaForCausalLM) is True
    assert upstream.supports_attention_backend(torch.nn.Linear) is False


def test_no_split_modules_round_trip():
    model = tiny_model("llama")
    assert "LlamaDecoderLayer" in upstream.no_split_modules(model)  # set on the instance at init
    assert upstream.no_split_modules(model.model.layers[0]) is None
    upstream.set_no_split_modules(model, {"X"})
    assert upstream.no_split_modules(model) == {"X"} and model._no_split_modules == {"X"}


def test_extra_config_types_is_where_autoconfig_register_writes():
    from transformers import AutoConfig, LlamaConfig

    class ProbeConfig(LlamaConfig):
        model_type = "hf_posenc_probe_upstream"

    AutoConfig.register(ProbeConfig.model_type, ProbeConfig, exist_ok=True)
    content = upstream.extra_config_types()
    assert dict.__getitem__(content, ProbeConfig.model_type) is ProbeConfig
    upstream.set_extra_config_types(content)  # hf-posenc's lookup wrapper installs itself this way
    assert upstream.extra_config_types() is content


def test_the_attention_implementation_hook_exists_with_its_arguments():
    hook = getattr(PreTrainedModel, upstream.ATTN_IMPLEMENTATION_HOOK)
    assert list(inspect.signature(hook).parameters)[:3] == ["self", "attn_implementation", "is_init_check"]


def test_parser_option_and_actions_read_hf_argument_parser():
    parser = HfArgumentParser(TrainingArguments, add_help=False)
    action = upstream.parser_option(parser, "--report_to")
    assert action.dest == "report_to"
    assert action in upstream.parser_actions(parser)
    assert upstream.parser_option(parser, "--output_dir").dest == "output_dir"


def test_name_or_path_is_where_from_pretrained_read_the_config(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    from transformers import AutoConfig

    assert upstream.name_or_path(AutoConfig.from_pretrained(tmp_path)) == str(tmp_path)
    assert upstream.name_or_path(tiny_model("llama").config) is None  # built from a config, read from nowhere
