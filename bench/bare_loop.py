"""bench/train_step.py's `bare` reference: a minimal OPD (and NCA) step written with nothing of mechopd's trainer
around it (see that script's docstring for the settings); bench/long_context.py reuses it (as train_step.BareLoop)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


class BareLoop:
    """The minimal reference loop (see module docstring). Prompts of both views are tokenized once, up front."""

    def __init__(self, path: Path, batch: int, new_tokens: int, lr: float, seed: int, pool: int, nca: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mechopd.tasks.base import get_task

        self.tok = AutoTokenizer.from_pretrained(path)
        self.student = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
        self.teacher = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.student.parameters(), lr=lr, weight_decay=0.0)
        items = get_task("rules").examples("train", pool, seed)
        self.px = self._encode([ex.prompt for ex in items])  # no-context view
        self.pc = self._encode([ex.context + "\n\n" + ex.prompt for ex in items])  # context view ("user" placement)
        self.B, self.R, self.pos, self.pad, self.nca = batch, new_tokens, 0, self.tok.pad_token_id, nca
        self.stop = torch.tensor([self.tok.eos_token_id])
        self.gen = torch.Generator().manual_seed(seed)

    def _encode(self, user_texts: list[str]) -> list[list[int]]:
        convs = [[{"role": "user", "content": t}] for t in user_texts]
        texts = self.tok.apply_chat_template(convs, tokenize=False, add_generation_prompt=True)
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        P = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), P), self.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), P), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, P - len(s) :] = torch.tensor(s)
            mask[i, P - len(s) :] = 1
        return ids, mask

    @torch.no_grad()
    def _decode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, P] left-padded prompts -> [B, R] sampled ids (temperature 1, KV cache)."""
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.student(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        nxt, done, toks = pos[:, -1:] + 1, torch.zeros(ids.shape[0], dtype=torch.bool), []
        for t in range(self.R):
            tok = torch.multinomial(torch.softmax(out.logits[:, -1], -1), 1, generator=self.gen).squeeze(-1)
            toks.append(torch.where(done, self.pad, tok))
            done |= torch.isin(tok, self.stop)
            if t == self.R - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            out = self.student(
                input_ids=tok[:, None], attention_mask=mask, position_ids=nxt, cache=out.cache, use_cache=True
            )
            nxt = nxt + 1
        return torch.stack(toks, 1)

    def _logits(self, model: Any, prompts: list[list[int]], resp: torch.Tensor) -> torch.Tensor:
        """[B, R, V]: the logits predicting each response token, prompt left-padded."""
        ids, mask = self._left_pad(prompts)
        ids, mask = torch.cat([ids, resp], 1), torch.cat([mask, torch.ones_like(resp)], 1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        return model(
            input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=resp.shape[1] + 1, use_cache=False
        ).logits[:, :-1]

    def step(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        rows = [(self.pos + i) % len(self.px) for i in range(self.B)]
        self.pos += self.B
        resp = self._decode(*self._left_pad([self.px[r] for r in rows]))  # [B, R]
        with torch.no_grad():
            t_logp = torch.log_softmax(self._logits(self.teacher, [self.pc[r] for r in rows], resp), -1)
        s_logp = torch.log_softmax(self._logits(self.student, [self.px[r] for r in rows], resp), -1)
        loss = (s_logp.exp() * (s_logp - t_logp)).sum(-1).mean()  # KL(q_x || f), token mean (all rows length R)
        if self.nca:  # + 0.5 KL(sg[q_x] || q_c): one extra student forward/backward on the context view
            c_logp = torch.log_softmax(self._logits(self.student, [self.pc[r] for r in rows], resp), -1)
            anchor = s_logp.detach()
            loss = loss + 0.5 * (anchor.exp() * (anchor - c_logp)).sum(-1).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
        self.opt.step()
        return time.perf_counter() - t0, float((resp != self.pad).sum(1).float().mean())  # pad is never sampled
