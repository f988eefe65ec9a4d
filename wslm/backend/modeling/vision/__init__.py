"""Vision towers (image encoders) of vision-language families, plain tensors like the text models."""
