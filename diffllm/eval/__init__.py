"""Evaluation of trained runs: generation, perplexity / bits per byte, multi-needle retrieval, attention allocation,
activation outliers, lm-evaluation-harness, and a comparison report across runs.

Commands (each module's `main`): generate, eval ppl, eval needle, eval attention, eval outliers, eval lm-eval,
eval compare. Plain functions over a model in memory, for in-loop evaluation:
    ppl.perplexity(model, batches, n_bytes)            {loss, ppl, tokens[, bits_per_byte]}
    needle.needle_accuracy(model, tok, NeedleTask())   {cells, by_n, mean}
    outliers.outlier_stats(model, batches)             Table 5 top-k / median; outliers.quantised_losses(...)
    attention.attention_by_depth(model, tok, ...)      attention to the answer needle per depth and layer
    harness.evaluate(model, tok, tasks)                lm-eval results (optional extra)
"""
