"""Export to other formats (Hugging Face): weight-name and config conversions."""
