"""Scoring: the pipeline's steps (prepare, launch, finish) and predict(), the reference path."""
