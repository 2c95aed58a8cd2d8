"""Products computed outside the arithmetic lanes, so that lanes never active together share
one multiplier.

The element-wise adder (ADD) and the channel scaler (CHANNEL_SCALE, MUL) follow each other in
the post chain and at most one of them is enabled in a group, yet each lane of each held its
own multipliers: four and three MULT18X18D per lane on ECP5. A lane now hands its operands out
through a :class:`Product` port and reads the registered product back a cycle later — the
same pipeline stage it had — and :func:`multiply` builds one multiplier per group of ports,
the enabled unit's operands chosen by a configuration register.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Shape, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Product", "multiply", "products_members", "lane_products", "OwnProducts"]


class Product(wiring.Signature):
    """A lane's multiplier port: the lane drives ``a`` and ``b`` and reads ``p = a·b``, as
    registered in the cycle after the operands (the product's pipeline stage)."""

    def __init__(self, a_shape, b_shape, p_shape):
        super().__init__({"a": Out(a_shape), "b": Out(b_shape), "p": In(p_shape)})


def _union(shapes) -> Shape:
    """The narrowest shape that holds every value of ``shapes``."""
    shapes = [Shape.cast(s) for s in shapes]
    if not any(s.signed for s in shapes):
        return Shape(max(s.width for s in shapes))
    return signed(max(s.width + (not s.signed) for s in shapes))


def multiply(m, ports, select=None, name: str = "product"):
    """One multiplier for the :class:`Product` ports ``ports`` (as their lanes drive them):
    the operands of ``ports[select]`` (``ports[0]`` when there is one port and no
    ``select``), multiplied and registered, go to every port's ``p``, each truncated to its
    width. ``select`` must stay constant while a selected lane has products in flight."""
    if select is None and len(ports) != 1:
        raise ValueError("several ports need a select signal")
    a_shape = _union(port.a.shape() for port in ports)
    b_shape = _union(port.b.shape() for port in ports)
    a = Signal(a_shape, name=f"{name}_a")
    b = Signal(b_shape, name=f"{name}_b")
    if select is None:
        m.d.comb += [a.eq(ports[0].a), b.eq(ports[0].b)]
    else:
        chosen_a, chosen_b = ports[-1].a, ports[-1].b
        for index in reversed(range(len(ports) - 1)):
            chosen_a = Mux(select == index, ports[index].a, chosen_a)
            chosen_b = Mux(select == index, ports[index].b, chosen_b)
        m.d.comb += [a.eq(chosen_a), b.eq(chosen_b)]
    width = a_shape.width + b_shape.width
    p = Signal(signed(width) if a_shape.signed or b_shape.signed else width, name=name,
               reset_less=True)
    m.d.sync += p.eq(a * b)
    for port in ports:
        m.d.comb += port.p.eq(p)
    return p


def products_members(ports: dict[str, Product], lanes: int, shared: bool) -> dict:
    """A multi-lane unit's signature members for its lanes' :class:`Product` ports
    (``name → signature``): ``<name>_products``, one port per lane, when ``shared``."""
    if not shared:
        return {}
    return {f"{name}_products": Out(product).array(lanes) for name, product in ports.items()}


def lane_products(m, owner, unit, lane: int, names):
    """Lane ``lane``'s ports ``<name>_product`` of ``unit``: forwarded to the owner's
    ``<name>_products`` when it shares them (``owner.shared_products``), or each given a
    multiplier of its own."""
    for name in names:
        port = getattr(unit, f"{name}_product")
        if owner.shared_products:
            wiring.connect(m, port, wiring.flipped(getattr(owner, f"{name}_products")[lane]))
        else:
            multiply(m, [port], name=f"{name}_product_{lane}")


class OwnProducts(wiring.Component):
    """``lane`` with a multiplier of its own behind each of its :class:`Product` ports: the
    lane alone, with every other port of its signature (what the lane tests drive)."""

    def __init__(self, lane: wiring.Component):
        self.lane = lane
        self._products = [name for name, member in lane.signature.members.items()
                          if member.is_signature and isinstance(member.signature, Product)]
        super().__init__({name: member for name, member in lane.signature.members.items()
                          if name not in self._products})

    def elaborate(self, platform):
        m = Module()
        m.submodules.lane = lane = self.lane
        for name, member in self.signature.members.items():
            if member.flow == In:
                m.d.comb += getattr(lane, name).eq(getattr(self, name))
            else:
                m.d.comb += getattr(self, name).eq(getattr(lane, name))
        for name in self._products:
            multiply(m, [getattr(lane, name)], name=name)
        return m
