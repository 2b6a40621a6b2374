"""The torch baseline of the Llama end-to-end benchmark: a compact Llama forward (f16, fused qkv and gate/up
weights, static KV cache [layers, B, kv_heads, max_len, head_dim], F.scaled_dot_product_attention with GQA),
written the way gpt-fast serves it. One decoder layer is compiled with torch.compile (inductor, fullgraph, static
shapes) and reused by all layers; the whole greedy decode step (32 layers, head, argmax, next position) is then
captured into one CUDA graph, which is what mode="reduce-overhead" does, but compiling one layer instead of an
unrolled 32-layer graph (a fraction of the compile time). Prefill runs the same layer eagerly (GEMM-bound)."""
import torch
import torch.nn.functional as F

from llama_random import weight


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    """HF rotate_half pairing; x [B, heads, T, D], cos/sin [T, D] (f32)."""
    d = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat((-xf[..., d:], xf[..., :d]), dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


class StaticLlama:
    """Weights of one random Llama (llama_random names and seeds); set_batch() sizes the static cache."""

    def __init__(self, shape, device="cuda", dtype=torch.float16, compile_layer=True):
        s = self.s = shape
        self.device, self.dtype = device, dtype
        w = lambda name, shp: weight(name, shp, device).to(dtype)  # noqa: E731
        self.embed = w("model.embed_tokens.weight", (s.vocab, s.hidden))
        self.layers = []
        for i in range(s.layers):
            p = f"model.layers.{i}."
            self.layers.append((
                torch.cat([w(p + "self_attn.q_proj.weight", (s.q_size, s.hidden)),
                           w(p + "self_attn.k_proj.weight", (s.kv_size, s.hidden)),
                           w(p + "self_attn.v_proj.weight", (s.kv_size, s.hidden))]),
                w(p + "self_attn.o_proj.weight", (s.hidden, s.q_size)),
                torch.cat([w(p + "mlp.gate_proj.weight", (s.inter, s.hidden)),
                           w(p + "mlp.up_proj.weight", (s.inter, s.hidden))]),
                w(p + "mlp.down_proj.weight", (s.hidden, s.inter)),
                w(p + "input_layernorm.weight", (s.hidden,)),
                w(p + "post_attention_layernorm.weight", (s.hidden,))))
        self.norm = w("model.norm.weight", (s.hidden,))
        self.lm_head = w("lm_head.weight", (s.vocab, s.hidden))
        self.layer_fn = torch.compile(self._layer, fullgraph=True, dynamic=False) if compile_layer else self._layer
        self.k_cache = self.v_cache = self.graph = None

    def set_batch(self, batch, max_len):
        """A zeroed static cache for `batch` sequences of up to max_len tokens (the previous one is freed first),
        rope tables, and the decode state (next ids, position) that the CUDA graph reads and writes."""
        s = self.s
        self.k_cache = self.v_cache = self.graph = None
        if str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()
        self.batch, self.max_len = batch, max_len
        kv_shape = (s.layers, batch, s.kv_heads, max_len, s.head_dim)
        self.k_cache = torch.zeros(kv_shape, device=self.device, dtype=self.dtype)
        self.v_cache = torch.zeros(kv_shape, device=self.device, dtype=self.dtype)
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=self.device, dtype=torch.float32)
                                      / s.head_dim))
        ang = torch.outer(torch.arange(max_len, device=self.device, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.cos, self.sin = ang.cos(), ang.sin()
        self.ids = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.history = torch.zeros(batch, max_len + 1, dtype=torch.long, device=self.device)  # [:, p]: token at p

    def weight_bytes(self):
        """Bytes one decode step reads from weights (the embedding contributes one row per sequence)."""
        n = sum(t.numel() for layer in self.layers for t in layer) + self.norm.numel() + self.lm_head.numel()
        return n * self.embed.element_size()

    def _layer(self, x, cos, sin, pos, mask, k_cache, v_cache, wqkv, wo, wgu, wd, n1, n2):
        """x [B, T, H] at positions pos [T] (cos/sin: their rope rows); writes K/V at pos. mask None: prefill of
        an empty cache (causal attention over the new keys, flash kernel); else a decode step (T = 1) over the
        whole static cache with mask [1, max_len] (True = attend), the query heads sharing a KV head batched as
        query rows (no K/V repeat)."""
        s = self.s
        B, T, _ = x.shape
        qkv = F.linear(rms_norm(x, n1, s.eps), wqkv)
        q, k, v = qkv.split([s.q_size, s.kv_size, s.kv_size], dim=-1)
        q = q.view(B, T, s.heads, s.head_dim).transpose(1, 2)
        k = k.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        v = v.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
        else:
            g = s.heads // s.kv_heads
            o = F.scaled_dot_product_attention(q.reshape(B, s.kv_heads, g, s.head_dim), k_cache, v_cache,
                                               attn_mask=mask)
        x = x + F.linear(o.reshape(B, T, s.q_size), wo)
        gate, up = F.linear(rms_norm(x, n2, s.eps), wgu).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, wd)

    def _forward(self, ids, pos, layer_fn, decode, rows=slice(None)):
        """ids [B, T] -> greedy next ids [B] (logits of the last position only); `rows`: the cache rows of ids."""
        mask = (torch.arange(self.max_len, device=self.device) <= pos).unsqueeze(0) if decode else None
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[pos], self.sin[pos]
        for i, layer in enumerate(self.layers):
            x = layer_fn(x, cos, sin, pos, mask, self.k_cache[i][rows], self.v_cache[i][rows], *layer)
        logits = F.linear(rms_norm(x[:, -1], self.norm, self.s.eps), self.lm_head)
        return logits.argmax(-1)

    @torch.no_grad()
    def prefill(self, prompt_ids, rows=None):
        """prompt_ids [B, T] (the batch this cache was built for): fills positions 0..T-1, returns the first
        generated ids and leaves the decode state at position T. Eager: at B x 512 tokens the GEMMs dominate.
        rows: sequences per forward (all at once by default), which bounds the activations of large batches."""
        B, T = prompt_ids.shape
        rows = rows or B
        pos = torch.arange(T, device=self.device)
        nxt = torch.cat([self._forward(prompt_ids[b:b + rows], pos, self._layer, False, slice(b, b + rows))
                         for b in range(0, B, rows)])
        self.ids.copy_(nxt)
        self.pos.fill_(T)
        self.history[:, T] = nxt
        return nxt

    def _step(self):
        nxt = self._forward(self.ids.unsqueeze(1), self.pos, self.layer_fn, True)
        self.ids.copy_(nxt)
        self.pos.add_(1)
        self.history.index_copy_(1, self.pos, nxt.unsqueeze(1))

    @torch.no_grad()
    def capture(self, warmup=3):
        """Compiles the layer (first calls) and records one decode step into a CUDA graph. Leaves the cache
        dirty: call prefill() before timing."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize()

    @torch.no_grad()
    def decode(self, steps):
        """`steps` greedy steps from the current state; returns the ids of the last step."""
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
        return self.ids
