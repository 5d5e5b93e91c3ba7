"""`wide-export analyze`: what a WIDE checkpoint does on real text.

Per layer, the sparsity its routers realize on the text (mean and spread
across tokens), perplexity of the dense base vs the WIDE model, and, given a
kernel benchmark's JSON, the speed-up those sparsities predict.
"""

from wide_export.analyze.run import AnalysisReport, LayerStats, analyze_text

__all__ = ["AnalysisReport", "LayerStats", "analyze_text"]
