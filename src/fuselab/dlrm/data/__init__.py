"""Criteo data: TSV preprocessing, parquet, synthetic generator, shard loader."""
