"""langtorch.nn — text modules (torch.nn.Modules whose forward maps TextTensors to TextTensors)."""
