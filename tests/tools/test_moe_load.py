"""Loading a sharded MoE checkpoint holds about one tensor besides the model: the peak
resident set of a fresh process stays within 1.2x the bytes the loaded model holds."""

from __future__ import annotations

from ckptd.tools.bench.moe_load import measure, moe_config, write_checkpoint


def test_peak_rss_of_a_moe_load_stays_near_the_model_size(tmp_path):
    folder = write_checkpoint(tmp_path / "moe", moe_config("test"), shard_bytes=32 << 20)
    assert len(list(folder.glob("*.safetensors"))) > 2            # sharded, with an index
    r = measure(folder, "float32", warm=True)
    assert r["model_bytes"] > 200 << 20                  # fp32 from bf16: every byte copied
    assert r["growth_over_model"] <= 1.2, r
