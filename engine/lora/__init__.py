from loraplex.engine.lora.adapter import LoRAAdapter, load_lora_adapter
from loraplex.engine.lora.lora_manager import LoRAManager

__all__ = ["LoRAAdapter", "LoRAManager", "load_lora_adapter"]
