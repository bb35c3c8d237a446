"""Vision-language-action models (issue 13): the frozen instruction encoder (``text``), the action tokenizer
(``tokenizer``) and the small CPU VLA (``model``)."""
