"""A GraphModule whose Python code is generated when first needed.

``torch.fx.GraphModule`` generates and compiles the Python code of its graph when it is built.
:func:`fxsym.analyze` only reads the graph and the module tree, and most analyses never run
the traced module, so the code of the module it keeps is generated on first use instead: a
call, :attr:`~DeferredGraphModule.code`, ``str()``, pickling or copying, an explicit
``recompile()``, or :attr:`fxsym.SymMap.graph_module` handing it out.

Imports from fxsym: nothing.
"""

from __future__ import annotations

from typing import Any

import torch.fx
from torch.fx.graph import PythonCode


class DeferredGraphModule(torch.fx.GraphModule):
    """``torch.fx.GraphModule(root, graph, class_name)`` with the same module tree, built
    without generating its code; once generated it is an ordinary GraphModule. Setting
    :attr:`graph` (as ``__init__`` does) leaves the code to generate on first use too."""

    @property
    def graph(self) -> torch.fx.Graph:
        return self._graph

    @graph.setter
    def graph(self, g: torch.fx.Graph) -> None:
        if not isinstance(g, torch.fx.Graph):
            raise TypeError(f"expected a torch.fx.Graph, got {type(g).__name__}")
        self._graph = g
        g.owning_module = self
        vars(self)["_code_pending"] = True

    @property
    def code_pending(self) -> bool:
        """Whether the code of the graph has not been generated yet."""
        return bool(vars(self).get("_code_pending"))

    def recompile(self) -> PythonCode:
        vars(self).pop("_code_pending", None)
        return super().recompile()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # reached only before the code exists: recompile() sets the generated forward on
        # this instance's own class (GraphModule gives every instance one)
        self.recompile()
        return self.forward(*args, **kwargs)

    @property
    def code(self) -> str:
        if self.code_pending:
            self.recompile()
        return super().code

    def __str__(self) -> str:
        if self.code_pending:
            self.recompile()
        return super().__str__()

    def __reduce__(self) -> tuple[Any, ...]:
        if self.code_pending:  # GraphModule pickles its __dict__ as it was before compiling
            self.recompile()
        return super().__reduce__()

    def __reduce_package__(self, exporter: Any) -> tuple[Any, ...]:
        if self.code_pending:
            self.recompile()
        return super().__reduce_package__(exporter)


__all__ = ["DeferredGraphModule"]
