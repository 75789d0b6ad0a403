/* tessera_cl_emulate.h: the built-ins of cl_khr_subgroups and cl_khr_integer_dot_product in plain
 * OpenCL C 1.2, for TESTS ONLY.  opencl.py includes it (through tessera_cl.h) when
 * TESSERA_OPENCL_EMULATE names a feature ("subgroups", "int_dot"), so the kernels' extension
 * paths -- otherwise compiled only for devices that have the extensions -- run and are checked
 * against the other backends on a device that has neither (PoCL, Oclgrind here).  The names
 * are macros over tsr_emu_* functions, so nothing collides with a runtime library that happens
 * to define the real built-ins.
 *
 * Sub-groups (TSR_EMULATE_SUBGROUPS): fixed groups of TSR_EMU_SG (4) consecutive work-items of
 * the work-group (linear local id), the last one partial when the local size is not a multiple:
 * a work-group of 8 or more work-items has several sub-groups, so the helpers' combine step
 * (partials through local memory, tessera_cl.h) really runs.  A real sub-group reduces in
 * registers; the emulated one goes through local memory, and OpenCL C 1.2 gives a helper local
 * memory only through an argument, so sub_group_reduce_* use the caller's pointer named
 * `scratch` (each tessera_cl.h helper that calls them has one, holding a value per work-item).
 * They contain barriers: legal because every work-item of the work-group calls the helpers
 * (tessera_cl.h's contract, which the real built-ins need too: every work-item of a sub-group).
 * Within a sub-group the values combine in work-item order; every member gets the result.
 *
 * Integer dot product (TSR_EMULATE_INT_DOT): dot(char4, char4) and dot(char4, uchar4) as the
 * widened sum of the four products -- what the extension defines (non-saturating) -- so
 * integer results must be bit-exact with the portable path.  `dot` becomes a function-like
 * macro: a program built with it must not call the geometric dot(floatn, floatn) (none does).
 */
#ifndef TESSERA_CL_EMULATE_H
#define TESSERA_CL_EMULATE_H

#if TSR_EMULATE_SUBGROUPS
#ifndef TSR_EMU_SG
#define TSR_EMU_SG 4
#endif
#undef TSR_HAS_SUBGROUPS
#define TSR_HAS_SUBGROUPS 1

inline uint tsr_emu_lid(void) {
    return (uint)(get_local_id(0) + get_local_size(0) * (get_local_id(1) + get_local_size(1) * get_local_id(2)));
}
inline uint tsr_emu_wg(void) { return (uint)(get_local_size(0) * get_local_size(1) * get_local_size(2)); }
inline uint tsr_emu_sg_first(void) { return tsr_emu_lid() / TSR_EMU_SG * TSR_EMU_SG; }
inline uint tsr_emu_sg_end(void) { return min(tsr_emu_sg_first() + TSR_EMU_SG, tsr_emu_wg()); }

#define get_sub_group_id() (tsr_emu_lid() / TSR_EMU_SG)
#define get_sub_group_local_id() (tsr_emu_lid() % TSR_EMU_SG)
#define get_num_sub_groups() ((tsr_emu_wg() + TSR_EMU_SG - 1) / TSR_EMU_SG)
#define get_sub_group_size() (tsr_emu_sg_end() - tsr_emu_sg_first())
#define get_max_sub_group_size() (min((uint)TSR_EMU_SG, tsr_emu_wg()))

inline float tsr_emu_sg_add(float v, __local void *scratch) {
    __local float *s = (__local float *)scratch;
    s[tsr_emu_lid()] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint a = tsr_emu_sg_first(), b = tsr_emu_sg_end();
    float r = s[a];
    for (uint k = a + 1; k < b; k++) r += s[k];
    barrier(CLK_LOCAL_MEM_FENCE);   /* the caller writes scratch next */
    return r;
}

inline float tsr_emu_sg_max(float v, __local void *scratch) {
    __local float *s = (__local float *)scratch;
    s[tsr_emu_lid()] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint a = tsr_emu_sg_first(), b = tsr_emu_sg_end();
    float r = s[a];
    for (uint k = a + 1; k < b; k++) r = fmax(r, s[k]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline int tsr_emu_sg_min(int v, __local void *scratch) {
    __local int *s = (__local int *)scratch;
    s[tsr_emu_lid()] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint a = tsr_emu_sg_first(), b = tsr_emu_sg_end();
    int r = s[a];
    for (uint k = a + 1; k < b; k++) r = min(r, s[k]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

#define sub_group_reduce_add(v) tsr_emu_sg_add((v), scratch)
#define sub_group_reduce_max(v) tsr_emu_sg_max((v), scratch)
#define sub_group_reduce_min(v) tsr_emu_sg_min((v), scratch)
#endif

#if TSR_EMULATE_INT_DOT
#undef TSR_HAS_INT_DOT
#define TSR_HAS_INT_DOT 1

inline int __attribute__((overloadable)) tsr_emu_dot(char4 a, char4 b) {
    return ((int)a.x * (int)b.x + (int)a.y * (int)b.y) + ((int)a.z * (int)b.z + (int)a.w * (int)b.w);
}
inline int __attribute__((overloadable)) tsr_emu_dot(char4 a, uchar4 b) {
    return ((int)a.x * (int)b.x + (int)a.y * (int)b.y) + ((int)a.z * (int)b.z + (int)a.w * (int)b.w);
}
#undef dot   /* PoCL's library spells its built-in as a macro */
#define dot(a, b) tsr_emu_dot((a), (b))
#endif

#endif
