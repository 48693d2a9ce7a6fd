"""The PyTorch peer: Hugging Face transformers' ELECTRA wired with the official objective.

Used by `benchmarks/pretrain_step.py` (speed) and `experiments/rtd_crosscheck.py` (learning
curves of an independent implementation on the same data). Not part of the package: it needs
torch and transformers (requirements-test.txt).

What it wires: `ElectraForMaskedLM` (generator) + `ElectraForPreTraining` (discriminator), the
whole embedding block shared and the MLM output matrix tied to it, dynamic masking as the
official `pretrain_helpers.mask` (k = max(1, min(N, round(n * p))) slots per example, positions
drawn with replacement over real non-special tokens, 85% set to [MASK]), the MLM head on the
masked positions only, Gumbel-max sampling without gradient, a sample equal to the original
counting as original, loss MLM + 50 RTD, AdamW (eps 1e-6, decay 0.01 except LayerNorm / bias),
global-norm clipping at 1, linear warmup, then (optionally) the official linear decay to 0.
"""

from __future__ import annotations

import os
from typing import Dict, Optional


class TorchElectra:
    """One ELECTRA pretraining setup in PyTorch; `step(batch)` trains on one batch.

    Args:
        discriminator, generator: dicts of hidden_size, num_hidden_layers, num_attention_heads,
            intermediate_size.
        vocab_size, embedding_size: ints.
        special: {"pad_id", "cls_id", "sep_id", "mask_id"}.
        max_predictions: int. Masked slots per example (N).
        learning_rate, num_warmup_steps: the schedule's peak and warmup.
        num_train_steps: optional; linear decay to 0 at this step (official, power 1).
        dtype: "float32" or "bfloat16" (autocast).
        seed: int. torch's global seed (init, dropout, masking, sampling).
        compile: bool. Run the generator's and the discriminator's forward (and so backward)
            passes through `torch.compile` (default TorchInductor backend; needs a C++ compiler).
        device: str. Where the models, the batches and the step run ("cpu", "cuda", ...); the
            batches given to `step` must be on it. bf16 autocast follows its type.
    """

    def __init__(self, discriminator: dict, generator: dict, *, vocab_size: int,
                 embedding_size: int, special: dict, max_predictions: int,
                 learning_rate: float, num_warmup_steps: int,
                 num_train_steps: Optional[int] = None, dtype: str = "float32",
                 mask_prob: float = 0.15, disc_weight: float = 50.0, seed: int = 0,
                 compile: bool = False, device: str = "cpu"):
        import torch
        from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

        self.torch = torch
        torch.set_num_threads(os.cpu_count())
        torch.manual_seed(seed)
        common = dict(vocab_size=vocab_size, embedding_size=embedding_size, hidden_act="gelu",
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                      max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                      pad_token_id=special["pad_id"])
        self.discriminator = ElectraForPreTraining(ElectraConfig(**common, **discriminator))
        self.generator = ElectraForMaskedLM(ElectraConfig(**common, **generator))
        # Official sharing: the whole embedding block (word + position + type tables and
        # LayerNorm); the generator's MLM output matrix is the shared word table.
        self.generator.electra.embeddings = self.discriminator.electra.embeddings
        self.generator.generator_lm_head.weight = \
            self.discriminator.electra.embeddings.word_embeddings.weight
        modules = torch.nn.ModuleDict({"generator": self.generator,
                                       "discriminator": self.discriminator})
        modules.to(device)
        modules.train()
        params = {id(p): (n, p) for n, p in modules.named_parameters()}  # dedupe tied tensors
        no_decay = lambda n: any(k in n for k in ("LayerNorm", "bias"))  # noqa: E731
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for n, p in params.values() if not no_decay(n)], "weight_decay": 0.01},
             {"params": [p for n, p in params.values() if no_decay(n)], "weight_decay": 0.0}],
            lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)
        self.params = [p for _, p in params.values()]

        def rate(step):
            # Official: linear warmup replaces the decayed rate while step < warmup.
            if num_warmup_steps and step < num_warmup_steps:
                return step / num_warmup_steps
            return max(0.0, 1.0 - step / num_train_steps) if num_train_steps else 1.0

        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, rate)
        self.device = torch.device(device)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16,
                                       enabled=dtype == "bfloat16")
        self.vocab_size = vocab_size
        self.special = special
        self.max_predictions = max_predictions
        self.mask_prob = mask_prob
        self.disc_weight = disc_weight
        self.compiled = compile
        # torch.compile (TorchInductor) of the two forward passes, as a user would compile the
        # models; their backward passes are compiled with them (AOTAutograd). Masking, sampling,
        # the losses and the optimizer stay eager.
        wrap = torch.compile if compile else (lambda fn: fn)
        self._generator_logits = wrap(self._generator_forward)
        self._discriminator_logits = wrap(self._discriminator_forward)

    @classmethod
    def from_pretraining_config(cls, config, special: dict, **kwargs) -> "TorchElectra":
        """The peer of electra-tf's model for `config` (an electra_tf PretrainingConfig): the
        encoder sizes electra-tf derives (size preset, overrides, generator fractions), its
        vocabulary, masking, loss weight and schedule. `kwargs` (dtype, seed, compile, device,
        ...) go to the constructor and win."""
        from electra_tf.config.model_config import get_bert_config, get_generator_config

        encoders = [get_bert_config(config)]
        encoders.append(get_generator_config(config, encoders[0]))
        keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        settings = {name: getattr(config, name) for name in (
            "vocab_size", "learning_rate", "num_warmup_steps", "num_train_steps", "mask_prob",
            "disc_weight")}
        settings.update(embedding_size=encoders[0].embedding_size, special=special,
                        max_predictions=config.max_predictions_per_seq, **kwargs)
        return cls(*({k: getattr(e, k) for k in keys} for e in encoders), **settings)

    def _generator_forward(self, masked, input_mask, segment_ids, positions):
        """MLM logits [batch, N, vocab] at the masked positions (the generator's forward)."""
        generator = self.generator
        with self.autocast:
            hidden = generator.electra(masked, attention_mask=input_mask,
                                       token_type_ids=segment_ids).last_hidden_state
            hidden = self.torch.gather(hidden, 1,
                                       positions[..., None].expand(-1, -1, hidden.shape[-1]))
            return generator.generator_lm_head(generator.generator_predictions(hidden))

    def _discriminator_forward(self, fake, input_mask, segment_ids):
        """RTD logits [batch, seq] (the discriminator's forward)."""
        with self.autocast:
            return self.discriminator(fake, attention_mask=input_mask,
                                      token_type_ids=segment_ids).logits

    def _mask(self, input_ids, input_mask):
        torch = self.torch
        n_slots = self.max_predictions
        special = self.special
        candidates = (input_mask.bool() & (input_ids != special["cls_id"])
                      & (input_ids != special["sep_id"]) & (input_ids != special["mask_id"])).float()
        count = torch.clamp(torch.round(input_mask.sum(-1).float() * self.mask_prob), 1, n_slots)
        weights = (torch.arange(n_slots, device=input_ids.device)[None, :] < count[:, None]).float()
        positions = torch.multinomial(candidates, n_slots, replacement=True) * weights.long()
        labels = torch.gather(input_ids, 1, positions) * weights.long()
        to_mask = (torch.rand(positions.shape, device=input_ids.device) < 0.85) & weights.bool()
        # A position drawn more than once is masked if any of its draws says so. A scatter (max
        # of 0/1) rather than boolean indexing, which waits for the GPU to count the hits.
        hits = torch.zeros_like(input_ids).scatter_reduce(1, positions, to_mask.long(), "amax")
        masked = torch.where(hits.bool(), special["mask_id"], input_ids)
        return masked, positions, labels, weights

    def step(self, batch: Dict, auc_outputs: bool = True) -> Dict:
        """Trains on one batch of int64 tensors {"input_ids", "input_mask", "segment_ids"}
        [batch, seq] on `device`. Returns detached float tensors: loss, mlm_loss, disc_loss,
        mlm_accuracy, and with `auc_outputs` for AUC: disc_probs, disc_labels (real tokens only,
        flattened; selecting them waits for the GPU, so a speed benchmark leaves them out)."""
        torch = self.torch
        F = torch.nn.functional
        input_ids, input_mask, segment_ids = (batch["input_ids"], batch["input_mask"],
                                              batch["segment_ids"])
        masked, positions, labels, weights = self._mask(input_ids, input_mask)
        logits = self._generator_logits(masked, input_mask, segment_ids, positions).float()
        nll = F.cross_entropy(logits.reshape(-1, self.vocab_size), labels.reshape(-1),
                              reduction="none")
        mlm_loss = (nll * weights.reshape(-1)).sum() / (weights.sum() + 1e-6)
        with torch.no_grad():
            u = torch.rand(logits.shape, device=logits.device)
            gumbel = -torch.log(-torch.log(u + 1e-9) + 1e-9)
            sampled = torch.argmax(logits + gumbel, dim=-1)
            used = weights.bool() & (positions > 0)
            # Unused slots write position 0's own id back (a scatter: no wait for the GPU).
            fake = input_ids.scatter(1, positions * used,
                                     torch.where(used, sampled, input_ids[:, :1]))
            is_fake = (fake != input_ids).float()
            mlm_accuracy = ((logits.argmax(-1) == labels).float() * weights).sum() / weights.sum()
        disc_logits = self._discriminator_logits(fake, input_mask, segment_ids)
        mask_f = input_mask.float()
        rtd = F.binary_cross_entropy_with_logits(disc_logits.float(), is_fake, reduction="none")
        disc_loss = (rtd * mask_f).sum() / (mask_f.sum() + 1e-6)
        loss = mlm_loss + self.disc_weight * disc_loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.schedule.step()
        out = {"loss": loss.detach(), "mlm_loss": mlm_loss.detach(),
               "disc_loss": disc_loss.detach(), "mlm_accuracy": mlm_accuracy}
        if auc_outputs:
            real = input_mask.bool()
            out.update(disc_probs=torch.sigmoid(disc_logits.detach().float())[real],
                       disc_labels=is_fake[real])
        return out
