"""Small models the precision tools are tested and benchmarked on."""
