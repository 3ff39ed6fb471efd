"""Lower bounds of the search: seconds that no plan of a family, cell or candidate can beat,
whatever its layer split (Bounds, with the min-max solvers of minmax.py). The search prices
candidates in increasing bound order and stops when the next bound is no better than the K-th
best plan found, so the top K are exact under the cost model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..cost import compute as C
from ..cost.comm import collective_time, collective_time_affine, p2p_link
from ..cost.memory import layer_range_params, one_layer_params
from ..cost.moe_schedule import NO_A2A
from ..cost.parallel import (cp_layer_exposed_s, cp_ring_step, dp_collectives, ep_a2a, ep_layer_collectives,
                             moe_layer_floor, moe_recomputed, pp_gather_s, pp_message_bytes, tp_layer_collectives,
                             tp_layer_exposed_s)
from ..estimate import layer_time_of, time_key
from ..placement import placement_of
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .after_bound import AfterStepRows, joint_bound
from .minmax import (UNITS_TOL, count_floor_even, count_floor_groups, count_floor_rows, count_floor_unlimited,
                     integer_minmax, mixed_count_minmax, mixed_floor, mixed_floor_counts, mixed_floor_rows,
                     relaxed_minmax)
from .screen import fit_rows


class Bounds:
    """Per-layer and per-stage costs shared by many candidates (cached by time key and group)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, uneven_chunks: bool = True):
        self.model, self.cluster = model, cluster
        # whether a rank's layers need not divide by its vpp (the search's uneven_chunks): else
        # every stage holds a multiple of vpp layers (check_structure), and the whole-layer
        # bounds count layers vpp at a time
        self.uneven_chunks = uneven_chunks
        self._layer: dict = {}
        self._extra: dict = {}
        self._pp: dict = {}
        self._after: dict = {}
        self._after_groups: dict = {}
        self._work: dict = {}
        self._fam: dict = {}
        self._hop_min: dict = {}
        self._dense: dict = {}
        self._hop_arrays: dict = {}
        self._moe_only: dict = {}
        self._whole: dict = {}
        self._whole_kinds_of: dict = {}
        self._after_rows = AfterStepRows(model, cluster)

    def layer_costs(self, s: Strategy, tk: Strategy, group_name: str) -> tuple[float, float]:
        """(dense, MoE) seconds per layer and micro-batch on this group: compute + TP (+ EP);
        exactly what `estimate` charges per layer for these terms, the CP ring's exposure
        included (it is additive in layers; DP only adds).
        `tk` is s's time key (`time_key(s)`), passed in because building it is not free."""
        key = (tk, group_name)
        v = self._layer.get(key)
        if v is None:
            model, g = self.model, self.cluster.group(group_name)

            def tp(lt, moe=False):
                if s.tp <= 1:
                    return 0.0
                phases, _, _ = tp_layer_collectives(model, s, [g], self.cluster, moe)
                return tp_layer_exposed_s(phases, lt, s.recompute == "full", s.tp_comm_overlap,
                                          s.async_tensor_model_parallel_allreduce)

            t_cp = cp_ring_step(model, s, [g], self.cluster)[1] if s.cp > 1 else 0.0

            def cp(lt):   # the ring's exposure, as estimate's cp_cost charges it per layer
                return cp_layer_exposed_s(s, t_cp, lt.core_attention_forward) if s.cp > 1 else 0.0

            lt_d = layer_time_of(model, tk, g.gpu, False)
            dense = lt_d.total + tp(lt_d) + cp(lt_d)
            moe = dense
            if model.is_moe:
                lt_m = layer_time_of(model, tk, g.gpu, True)
                a2a = ep_a2a(ep_layer_collectives(model, s, [g], self.cluster)[0]) if s.ep > 1 else NO_A2A
                # the MoE layer as its schedule places it, all-to-alls included, at the least
                # warm-up share any stage has
                moe = moe_layer_floor(lt_m, s, a2a, moe_recomputed(s)) + tp(lt_m, True) + cp(lt_m)
            v = self._layer[key] = (dense, moe)
        return v

    def _kinds(self):
        """Layer kinds present: (index into layer_costs, how many layers)."""
        return [(int(moe), self.model.num_moe_layers if moe else self.model.num_dense_layers)
                for moe in self.model.layer_kinds]

    def work(self, s: Strategy, tk: Strategy, names) -> tuple[dict, float]:
        """Layers in work units (seconds on names[0]'s GPUs, summed over the model's layers),
        each group's seconds per unit r_g (a layer of kind k costs >= r_g w_k there), and the
        least sum of all layer times over any placement (each layer on its cheapest group)."""
        key = (tk, tuple(names))
        v = self._work.get(key)
        if v is None:
            v = self._work[key] = self._compute_work(s, tk, names)
        return v

    def _compute_work(self, s: Strategy, tk: Strategy, names) -> tuple[dict, float]:
        kinds = self._kinds()
        ref = self.layer_costs(s, tk, names[0])
        units = sum(n * ref[k] for k, n in kinds)
        costs = {g: self.layer_costs(s, tk, g) for g in names}
        rate = {g: min(costs[g][k] / ref[k] for k, _ in kinds) for g in names}
        least = sum(n * min(costs[g][k] for g in names) for k, n in kinds)
        floor = {g: min(costs[g][k] for k, _ in kinds) for g in names}
        unit_max = max(ref[k] for k, _ in kinds)   # the most units one layer can carry
        return {"units": units, "rate": rate, "floor": floor, "unit_max": unit_max,
                "moe": {g: costs[g][1] for g in names},
                "dense_saves": {g: max(0.0, costs[g][1] - costs[g][0]) for g in names}}, least

    def ends(self, s: Strategy, tk: Strategy, group_name: str) -> tuple[float, float]:
        """(embedding, output layer) forward + backward seconds per micro-batch on this group."""
        key = (tk, group_name)
        v = self._extra.get(key)
        if v is None:
            gpu = self.cluster.group(group_name).gpu
            v = self._extra[key] = (sum(C.embedding_time(self.model, s, gpu)),
                                    sum(C.output_layer_time(self.model, s, gpu)))
        return v

    def pp_hop(self, s: Strategy, a: str, b: str, same_node: bool = False) -> float:
        """One activation send between stages on groups a and b, as `estimate` prices it."""
        key = (s.seq_length, s.cp, s.micro_batch_size, s.tp, s.sp, a, b, same_node)
        v = self._pp.get(key)
        if v is None:
            link = p2p_link(self.cluster.group(a), self.cluster.group(b), same_node, self.cluster)
            v = self._pp[key] = (collective_time("send-recv", pp_message_bytes(self.model, s), 2, link)
                                 + min(pp_gather_s(self.model, s, [self.cluster.group(x)], self.cluster)
                                       for x in (a, b)))
        return v

    def least_hop(self, s: Strategy, a: str, b: str, per: int | None = None) -> float:
        """The cheaper of the two ways two stages (of `per` GPUs, default s's) on groups a and b
        can talk (in one scale-up domain only when a stage is smaller than a domain of one group)."""
        hop = self.pp_hop(s, a, b)
        per = s.gpus_per_stage if per is None else per
        if a == b and per < self.cluster.group(a).domain_gpus:
            hop = min(hop, self.pp_hop(s, a, b, True))
        return hop

    def stage_caps(self, per: int, pp: int, layouts: dict) -> dict:
        """Most stages any placement puts on each node group (from stage_layouts' counts)."""
        names = [g.name for g in self.cluster.node_groups]
        return {g: max(c[i] for c in layouts) for i, g in enumerate(names)} if layouts else {}

    def family(self, s: Strategy, tk: Strategy, p: int, m: int, per: int, caps: dict, vmax: int,
               names: tuple | None = None, whole: bool = True) -> float:
        """Bound for every stage placement, vpp and ZeRO stage of p stages of `per` GPUs and m
        micro-batches with s's time class (TP, CP, EP, expert-TP, micro-batch, recompute): the
        cell bound (below) relaxed to the fastest GPUs the pipeline can use (speeds summed over
        its p fastest stage slots), the cheapest end stages and hop, and the bubble at the most
        virtual stages. `caps`: most stages per group; `names`: the groups with caps > 0, sorted
        (computed here when not given; the search passes them, it bounds 10^5 families).
        T is also at least the least time at which the stages hold the model in whole layers
        (_family_whole_layers: 61 layers on 27 stages need a stage of 3); not `whole`, at least
        that of p stages all as fast as the fastest (count_floor_even: no more, and O(1); the
        search orders 10^5 family groups by it)."""
        if names is None:
            names = tuple(sorted(g for g, c in caps.items() if c > 0))
        st = self._family_static(s, tk, names)
        units, speeds, f_min, emb, out, e_single, least, moe_min = st
        S, left = 0.0, p
        for speed, g in speeds:
            take = min(caps[g], left)
            S += take * speed
            left -= take
            if left == 0:
                break
        if left > 0:
            return float("inf")
        if p == 1:
            return m * max(f_min + e_single, units / S + e_single)
        hop = self._least_hop_of(s, names, per)
        T = max(f_min + hop, units / S + hop)
        if whole:
            T = max(T, self._family_whole_layers(s, tk, names, caps, p, hop))
        else:   # its cheaper floor: some stage holds ceil(L / p) layers (ceil(MoE layers / p) MoE ones)
            T = max(T, count_floor_even(f_min, hop, p, self.model.num_layers))
            mixed = self._n_dense_mixed()
            if mixed is not None:
                T = max(T, count_floor_even(moe_min, hop, p, self.model.num_layers - mixed))
        W = least + emb + out + p * hop
        return m * T + min(W - T, (W - T) / vmax)     # the bubble at vpp 1 or at the most virtual stages

    def _family_whole_layers(self, s: Strategy, tk: Strategy, names: tuple, caps: dict, p: int, hop: float) -> float:
        """The least slowest-stage time at which p stages, at most caps[g] on group g, hold the
        model's layers in whole layers, each stage paying hop: whatever the placement, its
        stages hold no more under T than the p fastest slots do (count_floor_unlimited with the
        lighter kind's seconds for all layers, and with dense and MoE layers the MoE layer's for
        the MoE ones, each with the slots fastest for it). Cached: the families of one time class
        and pipeline shape share it whatever their micro-batches."""
        key = (tk, names, tuple(caps.values()), p, hop)
        got = self._whole.get(key)
        if got is not None:
            return got
        T = -np.inf
        for need, fastest in self._whole_kinds(s, tk, names):
            a, counts, left = [], [], p
            for x, g in fastest:      # the p slots fastest for this layer kind
                take = min(caps[g], left)
                a.append(x)
                counts.append(take)
                left -= take
            T = max(T, count_floor_unlimited(a, hop, counts, need))
        self._whole[key] = T
        return T

    def _whole_kinds(self, s: Strategy, tk: Strategy, names: tuple) -> list:
        """_family_whole_layers' counts: (layers to hold, [(seconds a layer, group), fastest
        first]) for all layers at the lighter kind's seconds and, with dense and MoE layers,
        for the MoE layers at the MoE layer's (cached by time class and groups)."""
        key = (tk, names)
        got = self._whole_kinds_of.get(key)
        if got is None:
            w, _ = self.work(s, tk, names)
            mixed = self._n_dense_mixed()
            got = [(self.model.num_layers, sorted((w["floor"][g], g) for g in names))]
            if mixed is not None:
                got.append((self.model.num_layers - mixed, sorted((w["moe"][g], g) for g in names)))
            self._whole_kinds_of[key] = got
        return got

    def _family_static(self, s: Strategy, tk: Strategy, names: tuple) -> tuple:
        """What a family bound needs of its time class on these groups (cached)."""
        key = (tk, names)
        v = self._fam.get(key)
        if v is None:
            w, least = self.work(s, tk, names)
            speeds = sorted(((1.0 / w["rate"][g], g) for g in names), reverse=True)
            ends = [self.ends(s, tk, g) for g in names]
            v = self._fam[key] = (w["units"] * (1 - UNITS_TOL), speeds, min(w["floor"][g] for g in names),
                                  min(e[0] for e in ends), min(e[1] for e in ends), min(a + b for a, b in ends), least,
                                  min(w["moe"][g] for g in names))
        return v

    def cell(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], vpps=(1,), zeros=None) -> float:
        """Bound for every vpp, ZeRO stage and stage order of a multiset of stage groups:
        (m - 1/v) T + W / v + the after-step term, minimised over the cell's vpp and ZeRO
        stages, with T the least slowest-stage time and W the least sum of stage times when
        every stage pays only the cheapest PP hop and the end stages the cheapest group's
        embedding / output layer (see `candidate`). zeros None: s's own ZeRO stage."""
        return self.cell_bounds(s, tk, groups, vpps, zeros)[0]

    def cell_bounds(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], vpps=(1,), zeros=None,
                    rooms=()) -> list[float]:
        """[cell's bound, then for each of `rooms` the bound with the layers each stage can hold
        in memory]: rooms[k](vpp, zero) -> (row of each group, held) with held[row, t - 1] the
        ranks of the pipeline whose stage on that group can hold >= t layers (stage_rooms). A
        cell's stages on group g hold at most what its c_g roomiest ranks there can, so under
        T they hold at most sum_t min(c_g, held[g, t - 1]) layers of time e + t a_g (e the
        cheapest hops), and T is at least the least time at which those reach the model's
        layers (count_floor_groups: the lighter kind's seconds for all layers and, with dense
        and MoE layers, the MoE layer's for the MoE ones). inf: no candidate can fit."""
        p, m = s.pp, s.num_microbatches
        names = tuple(sorted(set(groups)))
        w, least = self.work(s, tk, names)
        zeros = (s.zero_stage,) if zeros is None else zeros
        afters = [self.after_step(s, names, z) for z in zeros]
        after = min(afters)
        counts = [groups.count(g) for g in names]
        S = sum(c / w["rate"][g] for g, c in zip(names, counts))
        units = w["units"] * (1 - UNITS_TOL)
        f_max = max(w["floor"][g] for g in names)
        ends = [self.ends(s, tk, g) for g in names]
        if p == 1:   # one stage holds every layer: memory caps add nothing a screen does not
            e = min(a + b for a, b in ends)
            bound = m * max(f_max + e, units / S + e) + after
            return [bound] * (1 + len(rooms))
        emb, out = min(e[0] for e in ends), min(e[1] for e in ends)
        hop = self._least_hop_of(s, names, s.gpus_per_stage)
        mixed = self._n_dense_mixed()
        per_v = []
        for v in vpps:
            e = v * hop
            # whole layers, q at a time (count_floor_unlimited; Bounds.layer_multiple)
            q, blocks = self._layer_blocks(v)
            whole = count_floor_unlimited([q * w["floor"][g] for g in names], e, counts, blocks)
            T = max(v * f_max + e, units / S + e, whole)
            if mixed is not None:
                T = max(T, mixed_floor_counts([v * w["moe"][g] + e for g in names],
                                               [w["dense_saves"][g] for g in names], counts, mixed, v),
                        count_floor_unlimited([w["moe"][g] for g in names], e, counts, self.model.num_layers - mixed))
            per_v.append((v, e, T, (least + emb + out + p * e) / v))
        out_bounds = [min((m - 1.0 / v) * T + W for v, _, T, W in per_v) + after]
        if not rooms:
            return out_bounds
        floor = np.array([w["floor"][g] for g in names])
        moe = np.array([w["moe"][g] for g in names])
        counts = np.array(counts)
        for room_of in rooms:
            best = float("inf")
            for v, e, T, W in per_v:
                for z, after_z in zip(zeros, afters):
                    row_of, held = room_of(v, z)
                    held = held[[row_of[g] for g in names]]
                    # q layers at a time: a stage holds q j layers where its ranks hold that many
                    q, blocks = self._layer_blocks(v)
                    Tc = max(T, count_floor_groups(q * floor, e, counts, held[:, q - 1::q], blocks))
                    if mixed is not None:
                        Tc = max(Tc, count_floor_groups(moe, e, counts, held, self.model.num_layers - mixed))
                    if Tc < float("inf"):
                        best = min(best, (m - 1.0 / v) * Tc + W + after_z)
            out_bounds.append(best)
        return out_bounds

    def layer_multiple(self, v: int) -> int:
        """The number every stage's layer count is a multiple of at vpp v: v with even chunks
        (Megatron's --num-virtual-stages-per-pipeline-rank), else 1."""
        return 1 if self.uneven_chunks else v

    def _layer_blocks(self, v: int) -> tuple[int, int]:
        """(q, the model's layers in blocks of q): the whole-layer counts at vpp v take q =
        layer_multiple(v) layers at a time."""
        q = self.layer_multiple(v)
        return q, -(-self.model.num_layers // q)

    def _n_dense_mixed(self) -> int | None:
        """The model's dense layers when it has both kinds (the mixed floor applies), else None."""
        return self.model.num_dense_layers if len(self.model.layer_kinds) > 1 else None

    def dense_ranks(self, p: int, v: int) -> frozenset | None:
        """Pipeline ranks that can hold a dense layer of a model with both kinds (None: one
        kind). Every virtual stage holds >= 1 layer (balanced_chunks), in Megatron's order
        (virtual stage k p + r is chunk k of rank r), so layer j sits in a virtual stage between
        j - (L - p v) and j: DeepSeek-V3's three dense layers first can only be on ranks 0-2."""
        if self._n_dense_mixed() is None:
            return None
        key = (p, v)
        got = self._dense.get(key)
        if got is None:
            L, V = self.model.num_layers, p * v
            ranks = set()
            for j in range(L):
                if not self.model.is_moe_layer(j):
                    ranks.update(vs % p for vs in range(max(0, j - (L - V)), min(j, V - 1) + 1))
                    if len(ranks) == p:
                        break
            got = self._dense[key] = frozenset(ranks)
        return got

    def children(self, s: Strategy, tk: Strategy, orders, vpps, zeros, rooms=()):
        """The bounds of every candidate of a cell: (rows, bounds), rows (vpp, ZeRO stage,
        order) each, bounds[0] their bounds without memory caps: the closed form of
        `candidate` over numpy arrays of the stages, one row per vpp. Stage i pays e_i = its end
        (embedding / output layer) + 2 v H_i, H_i its slower hop; the relaxed min-max is then
        T = max(max_i(v f_i + e_i), (U + sum e_i / r_i) / sum 1 / r_i) (every stage below its
        floor is impossible, above it the layers fill the stages in proportion to speed),
        W = least + sum e_i. `rooms`: for each, bounds[k + 1] with the most layers each stage
        can hold (rooms[k](vpp, zero) -> (row of each group, StageRooms), as memory_screen
        finds them): inf where the candidate cannot fit, else T also at least the least time
        at which whole layers fit under those caps (count_floor_rows: `candidate`'s
        integer_minmax and, for dense + MoE models, mixed_count_minmax)."""
        p, m = s.pp, s.num_microbatches
        names = tuple(sorted(set(orders[0])))
        w, least = self.work(s, tk, names)
        units = w["units"] * (1 - UNITS_TOL)
        after = {z: self.after_step(s, names, z) for z in zeros}
        v = np.array(vpps, dtype=float)[:, None]
        idx = {g: k for k, g in enumerate(names)}
        floor = np.array([w["floor"][g] for g in names])
        rinv = np.array([1.0 / w["rate"][g] for g in names])
        mixed = self._n_dense_mixed()
        moe = np.array([w["moe"][g] for g in names])
        saves = np.array([w["dense_saves"][g] for g in names])
        if mixed is not None:   # per vpp row, the ranks no dense layer can reach
            moe_only_mask = np.array([self.moe_only(p, int(x)) for x in vpps])
        ends = np.array([self.ends(s, tk, g) for g in names])
        per = s.gpus_per_stage
        hop, gpn = self._hops(s, names)
        rank = np.arange(p - 1)
        # every stage order of the cell at once: (orders, stages), then (orders, vpps, stages)
        gi = np.array([[idx[g] for g in groups] for groups in orders])
        n_orders, n_v = len(orders), len(vpps)
        end = np.zeros((n_orders, p))
        end[:, 0] += ends[gi[:, 0], 0]
        end[:, -1] += ends[gi[:, -1], 1]
        H = np.zeros((n_orders, p))
        if p > 1:
            a, b = gi[:, :-1], gi[:, 1:]
            same = (a == b) & ((rank * per) // gpn[a] == ((rank + 2) * per - 1) // gpn[a])
            h = hop[a, b, same.astype(int)]
            H[:, :-1] = h
            H[:, 1:] = np.maximum(H[:, 1:], h)
        F, R = floor[gi], rinv[gi]
        S = R.sum(axis=1)
        e = end[:, None, :] + 2 * v[None] * H[:, None, :]
        T = np.maximum((v[None] * F[:, None, :] + e).max(axis=2), (units + (e * R[:, None, :]).sum(axis=2)) / S[:, None])
        if mixed is not None:   # one row per order and vpp
            rows = (v[None] * moe[gi][:, None, :] + e).reshape(n_orders * n_v, p)
            T = np.maximum(T, mixed_floor_rows(rows, np.repeat(saves[gi], n_v, axis=0), mixed,
                                                np.tile(v, (n_orders, 1)), np.tile(moe_only_mask, (n_orders, 1)))
                           .reshape(n_orders, n_v))
        W = least + e.sum(axis=2)
        vv = v[:, 0]
        n_z = len(zeros)
        rows = [(vpp, z, groups) for groups in orders for vpp in vpps for z in zeros]
        # (orders, vpps, zeros), flattened in rows' order
        tail = np.array([after[z] for z in zeros])[None, None, :]
        Ts = [np.repeat(T[:, :, None], n_z, axis=2)]
        for room_of in rooms:
            caps = np.empty((n_orders, n_v, n_z, p), dtype=np.int64)
            fits = np.empty((n_orders, n_v, n_z), dtype=bool)
            for k, vpp in enumerate(vpps):
                for j, z in enumerate(zeros):
                    row_of, got = room_of(vpp, z)
                    caps[:, k, j], fits[:, k, j] = fit_rows(self.model, got, np.array([row_of[g] for g in names])[gi],
                                                            vpp)
            Tc = np.empty((n_orders, n_v, n_z))
            for k, vpp in enumerate(vpps):   # rows (orders, zeros) of each vpp
                q, blocks = self._layer_blocks(vpp)
                ck = caps[:, k].reshape(-1, p) // q     # a stage's layers come q at a time
                ek = np.repeat(e[:, k, :], n_z, axis=0)
                t = count_floor_rows(q * np.repeat(F, n_z, axis=0), ek, ck, blocks)
                if mixed is not None:
                    t = np.maximum(t, count_floor_rows(np.repeat(moe[gi], n_z, axis=0), ek, q * ck,
                                                       self.model.num_layers - mixed))
                Tc[:, k] = t.reshape(n_orders, n_z)
            Ts.append(np.where(fits, np.maximum(Ts[0], Tc), np.inf))
        vz = vv[None, :, None]
        with np.errstate(invalid="ignore"):   # 0 x inf: one micro-batch at vpp 1, a candidate that cannot fit
            bounds = [np.where(np.isinf(t), np.inf, (m * t if p == 1 else (m - 1.0 / vz) * t + W[:, :, None] / vz)
                               + tail).reshape(-1) for t in Ts]
        return rows, bounds

    def _least_hop_of(self, s: Strategy, names: tuple, per: int) -> float:
        """Twice the cheapest PP hop between any two of these groups for stages of `per` GPUs
        (family and cell bounds; cached by what least_hop reads)."""
        key = (s.seq_length, s.cp, s.micro_batch_size, s.tp, s.sp, per, names)
        got = self._hop_min.get(key)
        if got is None:
            got = self._hop_min[key] = 2 * min(self.least_hop(s, x, y, per) for x in names for y in names)
        return got

    def moe_only(self, p: int, v: int) -> np.ndarray:
        """Per pipeline rank, whether no dense layer can reach it (dense_ranks; a model with
        both kinds), as a bool array (cached)."""
        key = (p, v)
        got = self._moe_only.get(key)
        if got is None:
            reach = self.dense_ranks(p, v)
            got = self._moe_only[key] = np.array([r not in reach for r in range(p)])
        return got

    def _hops(self, s: Strategy, names: tuple) -> tuple[np.ndarray, np.ndarray]:
        """(hop[a, b, same domain]: one send between stages on groups a and b of `names`, in
        one scale-up domain only within a group; each group's GPUs per domain), for
        _same_node over whole stage orders (cached by what pp_hop reads)."""
        key = (s.seq_length, s.cp, s.micro_batch_size, s.tp, s.sp, names)
        got = self._hop_arrays.get(key)
        if got is None:
            got = self._hop_arrays[key] = (
                np.array([[[self.pp_hop(s, x, y, same and x == y) for same in (False, True)] for y in names]
                          for x in names]),
                np.array([self.cluster.group(g).domain_gpus for g in names]))
        return got

    def _same_node(self, groups, i: int, per: int) -> bool:
        """Whether stages i and i + 1 share a scale-up domain (estimate's stages_share_node)."""
        a = groups[i]
        if a != groups[i + 1]:
            return False
        gpn = self.cluster.group(a).domain_gpus
        return (i * per) // gpn == ((i + 2) * per - 1) // gpn

    def candidate(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], max_layers=None, extra_s=None) -> float:
        """Bound for one concrete candidate (its vpp, ZeRO stage and stage order):
        (m - 1/v) T + W / v + the after-step term, with T the least slowest-stage time and W the
        least sum of stage times over all layer splits (pipeline.py: T_pipe = (m - 1/v) max t_i
        + sum t_i / v). After the pipeline every stage runs its optimizer step and exposes the
        DP traffic its last backward does not hide, the slowest stage setting the step: the
        least over splits of the pipeline and that term together (after_bound.joint_bound,
        with each stage's term at each layer count), or where a stage's backward may run more
        than s's layers (extra_s), the least term of any stage (after_step).
        `max_layers`: the most layers each stage can hold in memory, if known; `extra_s`: seconds
        per micro-batch each stage adds on top of s's layer costs (recompute of k layers)."""
        p, v, m = s.pp, s.vpp, s.num_microbatches
        names = sorted(set(groups))
        w, least = self.work(s, tk, names)
        extras = self._stage_extras(s, tk, groups, extra_s)
        W = least + sum(extras)

        def pipe(caps) -> float:
            T = self._least_T(s, w, groups, extras, caps)
            return m * T if p == 1 else (m - 1.0 / v) * T + W / v

        plain = pipe(max_layers) + self.after_step(s, names)
        if extra_s is not None or plain == float("inf"):
            return plain
        L, (q, _) = self.model.num_layers, self._layer_blocks(v)
        n = np.arange(L + 1)
        room = np.full(p, L) if max_layers is None else np.asarray(max_layers)
        counts_ok = (n[None, :] >= v) & (n[None, :] % q == 0) & (n[None, :] <= room[:, None])
        joint = joint_bound(self._after_rows.rows(s, tk, groups), counts_ok, pipe)
        return max(plain, joint)

    def _least_T(self, s: Strategy, w: dict, groups: tuple[str, ...], extras: list, max_layers) -> float:
        """The least slowest-stage time over all layer splits with stage i holding at most
        max_layers[i] layers (None: any), its extras included (candidate's T)."""
        p, v = s.pp, s.vpp
        L = self.model.num_layers
        stages: dict = {}
        moe_stages: dict = {}   # for the mixed count bound: (an MoE layer's seconds, fixed, most layers)
        B, saves = [], []     # for the mixed floor: stage cost at v MoE layers, a dense layer's saving
        q, n_blocks = self._layer_blocks(v)
        for i, (g, e) in enumerate(zip(groups, extras)):
            n_cap = L if max_layers is None else max_layers[i] - max_layers[i] % q
            cap = float("inf") if max_layers is None else n_cap * w["unit_max"]
            key = (w["rate"][g], w["floor"][g], e, cap, n_cap)
            stages[key] = stages.get(key, 0) + 1
            mkey = (w["moe"][g], e, n_cap)
            moe_stages[mkey] = moe_stages.get(mkey, 0) + 1
            B.append(v * w["moe"][g] + e)
            saves.append(w["dense_saves"][g])
        # whole layers, q at a time: a stage holds n_cap // q blocks of q layers of q f seconds
        blocks: dict = {}
        for (r, f, e, cap, n_cap), k in stages.items():
            bkey = (r, q * f, e, cap, n_cap // q)
            blocks[bkey] = blocks.get(bkey, 0) + k
        T = max(relaxed_minmax(stages, w["units"], v), integer_minmax(blocks, n_blocks, -(-v // q)))
        mixed = self._n_dense_mixed()
        if mixed is not None and T < float("inf"):
            reach = self.dense_ranks(p, v)
            T = max(T, mixed_floor(B, saves, mixed, v, [r not in reach for r in range(p)]))
            if max_layers is not None:
                T = max(T, mixed_count_minmax(moe_stages, L, mixed, T))
        return T

    def _stage_extras(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], extra_s=None) -> list[float]:
        """Per stage, the seconds a micro-batch spends there beyond its layers: the embedding on
        the first, the output layer on the last, the slower of its two PP hops (each v times
        each way, on one node or across: estimate's stages_share_node) and extra_s."""
        p, v = s.pp, s.vpp
        per = s.gpus_per_stage
        seen: dict = {}
        hop = []
        for i in range(p - 1):
            key = (groups[i], groups[i + 1], self._same_node(groups, i, per))
            if key not in seen:
                seen[key] = 2 * v * self.pp_hop(s, *key)
            hop.append(seen[key])
        out = []
        for i, g in enumerate(groups):
            e = 0.0
            if i == 0:
                e += self.ends(s, tk, g)[0]
            if i == p - 1:
                e += self.ends(s, tk, g)[1]
            if p > 1:
                e += max(hop[i - 1] if i > 0 else 0.0, hop[i] if i < p - 1 else 0.0)
            if extra_s is not None:
                e += extra_s[i]
            out.append(e)
        return out

    def on_split(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], extra_s=None) -> float:
        """Bound for a candidate on its own layer split (s.layers_per_stage, which a block-
        recompute candidate keeps): `candidate`'s terms with each stage's time at its own layers,
        t_i = sum of their per-layer costs on its group (layer_costs) + its extras, instead of the
        least slowest-stage time over all splits: (m - 1/v) max t_i + sum t_i / v + the after-step
        term."""
        p, v, m = s.pp, s.vpp, s.num_microbatches
        costs = {g: self.layer_costs(s, tk, g) for g in set(groups)}
        extras = self._stage_extras(s, tk, groups, extra_s)
        t = []
        for i, (a, b) in enumerate(s.stage_layer_ranges(self.model)):
            dense, moe = costs[groups[i]]
            n_moe = self.model.num_moe_layers_in(a, b)
            t.append(extras[i] + n_moe * moe + (b - a - n_moe) * dense)
        pipe = m * max(t) if p == 1 else (m - 1.0 / v) * max(t) + sum(t) / v
        return pipe + self.after_step(s, sorted(set(groups)))

    def recompute_extra(self, s: Strategy, groups: tuple[str, ...]) -> list[float]:
        """Per stage, the least seconds a micro-batch spends re-running the forward of its
        fully recomputed layers (recompute_num_layers k: k per chunk, on s's own split), the
        lighter layer kind on the stage's group."""
        tk = time_key(replace(s, recompute_num_layers=None))
        per = {g: min(layer_time_of(self.model, tk, self.cluster.group(g).gpu, moe).recompute
                      for moe in self.model.layer_kinds)
               for g in set(groups)}
        return [s.vpp * min(s.recompute_num_layers, (b - a) // s.vpp) * per[groups[i]]
                for i, (a, b) in enumerate(s.stage_layer_ranges(self.model))]

    def block_candidate(self, s: Strategy, groups: tuple[str, ...], max_layers=None, tk=None) -> float:
        """Bound of a block-recompute candidate: its costs without recompute plus the re-run
        forward of its k layers per chunk, over all splits and on its own (on_split). `tk`: the
        plain strategy's time key, if at hand."""
        plain = replace(s, recompute="none", recompute_num_layers=None)
        tk = tk or time_key(plain)
        extra = self.recompute_extra(s, groups)
        # its split is fixed (the starting one): the bound on that split is the tighter one
        return max(self.candidate(plain, tk, groups, max_layers, extra_s=extra), self.on_split(plain, tk, groups, extra))

    def after_step(self, s: Strategy, names, zero: int | None = None) -> float:
        """Least seconds after the pipeline drains (estimate's after-step term, max over
        stages): the optimizer step of the slowest stage takes at least the mean shard on the
        fastest GPU (Adam is memory-bound, affine in its bytes), and every stage exposes at
        least its last layer's per-step DP collectives (estimate: t_dp / n_layers, and t_dp is
        affine in the bytes, so t_dp / n >= the bandwidth term of one layer's share).
        `candidate` prices the term stage by stage (after_bound.py); this is what every cell
        and family can afford (10^4 of them)."""
        z = s.zero_stage if zero is None else zero
        key = (s.tp, s.pp, s.dp, s.cp, s.ep, s.etp, z, s.offload_optimizer, tuple(names))
        v = self._after.get(key)
        if v is None:
            params, step_bytes, dp = self._after_terms(s, z)
            least_opt = 0.0 if s.offload_optimizer else min(
                C.optimizer_time(params / s.pp, self.cluster.group(g).gpu, step_bytes) for g in names)
            # every group hosts a stage; the stage with the largest optimizer shard pays at
            # least the smallest DP term
            v = self._after[key] = max(max(dp[g] for g in names), least_opt + min(dp[g] for g in names))
        return v

    def _after_terms(self, s: Strategy, z: int) -> tuple[float, float, dict]:
        """after_step's terms under ZeRO stage z: the optimizer-state parameters of the whole
        model one data-parallel rank holds (a stage holds 1/pp of them at the mean), Adam's
        bytes per parameter, and per node group one layer's share of the per-step DP
        collectives. They depend on the pipeline depth only through pp > 1 (the tied output
        layer's copy; placement's model axes are tp, ep and etp: pp splits by layers), so they
        are cached across depths and groups."""
        key = (s.tp, s.dp, s.cp, s.ep, s.etp, z, s.offload_optimizer, s.pp > 1)
        v = self._after_groups.get(key)
        if v is not None:
            return v
        if z != s.zero_stage:
            s = replace(s, zero_stage=z, overlap_param_gather=z >= 1)
        model = self.model
        placement = placement_of(s)
        all_stages = layer_range_params(model, s, 0, model.num_layers, True, True)
        params = placement.state_params("optimizer", all_stages)
        groups = self.cluster.node_groups
        # one layer's parameters per rank by group, the lighter layer kind present
        per_layer = {g: min(getattr(one_layer_params(model, moe), g) for moe in model.layer_kinds)
                     * placement.model_shard_factor(g) for g in ("dense", "norms", "experts")}
        dp = {}
        for g in groups:
            t = 0.0
            for c in dp_collectives(s, placement, [g], self.cluster):
                msg = per_layer[c.collective.group] * c.bytes_per_param
                if c.collective.when != "per-step" or msg <= 0:
                    continue
                # the bandwidth term of one layer's share (the latency is paid once per step)
                t += collective_time_affine(c.collective.kind, c.ranks, c.link, msg)[0] * msg
            dp[g.name] = t
        v = self._after_groups[key] = (params, C.adam_step_bytes_per_param(s), dp)
        return v
