"""Benchmarks of a trained model. Inference only: nothing here imports training/.

    python -m eval.hellaswag --checkpoint out/small      # HellaSwag acc / acc_norm (eval/hellaswag.py)
"""
