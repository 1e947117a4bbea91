/* .eh_frame / .debug_frame -> the in-kernel unwinder's rows (tracer/unwind/native.py loads this).
 *
 * The same rows as tracer/unwind/rows.py `build_table` (pyelftools), decoded in C: one pass over the
 * call-frame sections of an mmap'd ELF file, every CFA program run, each row encoded as
 *
 *     pc (u32 file offset) | cfa_off (s16, x8 bytes) | cfa_type (u8) | rbp_off (s8, x8 bytes)
 *
 * with the same priorities (.eh_frame over .debug_frame, an FDE-end `none` sentinel below both),
 * the same PC -> file offset mapping (the PT_LOAD segments' memory images), and consecutive equal
 * rows merged. Plain C and libc; no global state (one call = one `struct cfi_result`); every read
 * is bounds-checked. A malformed FDE (or CIE) is skipped; a call-frame section that runs past its
 * end, or past the file's, is an error. Values are kept in 128-bit integers, saturated, so that
 * the arithmetic is the exact one of the Python code for anything a real file holds.
 *
 * Where pyelftools 0.33 reads a file differently, this follows DWARF (and what gcc's unwinder
 * does): DW_CFA_def_cfa_sf scales by the data alignment factor (build_table corrects pyelftools to
 * match); FDE encodings textrel/datarel, CIEs without 'R' or 'z', DW_CFA_set_loc in the FDE's
 * pointer encoding, DW_CFA_GNU_negative_offset_extended and unknown opcodes (that FDE is skipped)
 * are handled here where pyelftools gives up on the whole file.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef __int128 i128;
#define SAT ((i128)1 << 100) /* |values| beyond this are all "huge": nothing they are compared with comes close */

struct cfi_row {
	uint32_t pc;
	int16_t cfa_off;
	uint8_t cfa_type;
	int8_t rbp_off;
};

struct cfi_result {
	struct cfi_row *rows; /* malloc'd; cfi_free() */
	uint64_t nrows;
	uint64_t fdes;    /* FDEs decoded */
	uint32_t sources; /* 1: .eh_frame, 2: .debug_frame (sections with contents) */
	uint32_t reserved;
	char error[240];
};

enum { CFI_OK = 0, CFI_ERROR = -1, CFI_FALLBACK = 1, CFI_NEED_DEBUG_FRAME = 2 };
/* the cfa types, in this order, come from the caller (probes/allocscope.h through tracer.base.layout) */
enum { T_NONE, T_RSP, T_RBP, T_PLT, T_SIGNAL, T_STOP, T_UNSUPPORTED, T_COUNT };

#define REG_RBP 6
#define REG_RSP 7
#define RBP_UNKNOWN (-128)
#define MAX_STACK 64 /* DW_CFA_remember_state depth */
#define MAX_BIG 16   /* register numbers >= 512 that one row may hold */

/* --------------------------------------------------------------------- bounded reads */

struct rd {
	const uint8_t *p, *end;
	int bad; /* sticky: a read ran past `end` */
};

static uint64_t rd_n(struct rd *r, int n) {
	if (r->bad || r->end - r->p < n) {
		r->bad = 1;
		return 0;
	}
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)r->p[i] << (8 * i);
	r->p += n;
	return v;
}

static i128 rd_leb(struct rd *r, int sign) {
	i128 v = 0;
	int shift = 0, huge = 0;
	uint8_t b;
	do {
		if (r->bad || r->p >= r->end) {
			r->bad = 1;
			return 0;
		}
		b = *r->p++;
		if (shift < 100)
			v |= (i128)(b & 0x7f) << shift;
		else if (b & 0x7f)
			huge = 1;
		shift += 7;
	} while (b & 0x80);
	if (sign && (b & 0x40) && shift < 127)
		v |= -((i128)1 << shift);
	if (huge || v > SAT || v < -SAT)
		v = (sign && (b & 0x40)) ? -SAT : SAT;
	return v;
}

static i128 sat(i128 v) { return v > SAT ? SAT : v < -SAT ? -SAT : v; }

static i128 sat_mul(i128 a, i128 b) {
	i128 r;
	if (__builtin_mul_overflow(a, b, &r))
		return ((a < 0) != (b < 0)) ? -SAT : SAT;
	return sat(r);
}

/* --------------------------------------------------------------------- growable arrays */

static int grow(void **p, uint64_t *cap, uint64_t need, size_t elem) {
	if (need <= *cap)
		return 0;
	uint64_t n = *cap ? *cap : 64;
	while (n < need)
		n *= 2;
	void *q = realloc(*p, n * elem);
	if (!q)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

/* --------------------------------------------------------------------- rows of one FDE */

enum { R_NONE, R_UNDEFINED, R_SAME, R_OFFSET, R_VAL_OFFSET, R_REGISTER, R_EXPR, R_VAL_EXPR };

struct rule {
	int type;
	i128 arg;
	const uint8_t *expr;
	uint64_t elen;
};

struct state {
	i128 pc;
	int cfa_expr;     /* DW_CFA_def_cfa_expression */
	int cfa_reg_none; /* pyelftools' CFARule(reg=None) */
	int cfa_off_none; /* CFARule(offset=None): def_cfa_register after an expression */
	i128 cfa_reg, cfa_off;
	const uint8_t *cfa_e;
	uint64_t cfa_elen;
	struct rule ra, rbp; /* the rules of the return address register and of rbp */
	uint64_t present[8]; /* registers 0..511 with a rule */
	i128 big[MAX_BIG];   /* and above */
	int nbig, nregs;
};

static void st_init(struct state *s, i128 pc) {
	memset(s, 0, sizeof(*s));
	s->pc = pc;
	s->cfa_reg_none = 1;
}

static int st_has(const struct state *s, i128 reg) {
	if (reg >= 0 && reg < 512)
		return (s->present[(int)reg >> 6] >> ((int)reg & 63)) & 1;
	for (int i = 0; i < s->nbig; i++)
		if (s->big[i] == reg)
			return 1;
	return 0;
}

static int st_add(struct state *s, i128 reg) {
	if (st_has(s, reg))
		return 0;
	if (reg >= 0 && reg < 512)
		s->present[(int)reg >> 6] |= 1ull << ((int)reg & 63);
	else if (s->nbig < MAX_BIG)
		s->big[s->nbig++] = reg;
	else
		return -1;
	s->nregs++;
	return 0;
}

static void st_del(struct state *s, i128 reg) {
	if (!st_has(s, reg))
		return;
	if (reg >= 0 && reg < 512) {
		s->present[(int)reg >> 6] &= ~(1ull << ((int)reg & 63));
	} else {
		for (int i = 0; i < s->nbig; i++)
			if (s->big[i] == reg) {
				s->big[i] = s->big[--s->nbig];
				break;
			}
	}
	s->nregs--;
}

/* --------------------------------------------------------------------- the build */

struct seg {
	uint64_t off, filesz, vaddr, memsz;
};

struct cie {
	uint64_t off;
	int ok;
	int has_z, fde_enc;
	i128 caf, daf, ra_reg;
	const uint8_t *ins, *ins_end;
	int decoded;  /* 0: not yet, 1: done, -1: its program is malformed */
	int has_last; /* its decoded table has a row: the FDEs start from it */
	struct state last;
};

struct section {
	const uint8_t *data;
	uint64_t size, addr;
	int eh;
};

struct pcenc {
	i128 pc;
	uint32_t enc;
};

struct build {
	uint8_t types[T_COUNT];
	const struct seg *segs;
	int nsegs;
	uint64_t text_addr, got_addr;
	int has_text, has_got;
	/* puts: key = pc << 32 | prio << 30 | sequence number; enc[seq] */
	uint64_t *keys;
	uint32_t *encs;
	uint64_t nput, cap_keys, cap_encs;
	/* .eh_frame FDE ranges (for .debug_frame's overlap test) */
	i128 (*covered)[2];
	uint64_t ncovered, cap_covered;
	/* CIEs of the current section, by offset */
	struct cie *cies;
	uint64_t ncies, cap_cies;
	uint64_t *cie_hash; /* index + 1, 0 = empty */
	uint64_t hash_cap;
	/* scratch */
	struct pcenc *rows;
	uint64_t nrows, cap_rows;
	struct state stack[MAX_STACK];
	uint64_t fdes;
	char *err;
};

static int fail(struct build *b, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->err, 240, fmt, ap);
	va_end(ap);
	return CFI_ERROR;
}

static int put(struct build *b, uint32_t pc, int prio, uint32_t enc) {
	if (b->nput >= (1u << 30))
		return -1;
	if (grow((void **)&b->keys, &b->cap_keys, b->nput + 1, sizeof(uint64_t)) ||
	    grow((void **)&b->encs, &b->cap_encs, b->nput + 1, sizeof(uint32_t)))
		return -1;
	b->keys[b->nput] = (uint64_t)pc << 32 | (uint64_t)prio << 30 | b->nput;
	b->encs[b->nput] = enc;
	b->nput++;
	return 0;
}

static uint32_t pack(int type, int off, int rbp) {
	return (uint32_t)type | (uint32_t)(uint16_t)off << 8 | (uint32_t)(uint8_t)rbp << 24;
}

static const uint8_t PLT_HEAD[] = {0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A};
static const uint8_t PLT_TAIL[] = {0x2A, 0x33, 0x24, 0x22};
static const uint8_t SIGNAL_CFA[] = {0x77, 0xA0, 0x01, 0x06};
static const uint8_t SIGNAL_RA[] = {0x77, 0xA8, 0x01};

/* tracer/unwind/rows.py `_encode`, rule for rule */
static uint32_t encode(const struct build *b, const struct state *s) {
	const uint8_t *t = b->types;
	const struct rule *ra = &s->ra;
	if (ra->type == R_UNDEFINED)
		return pack(t[T_STOP], 0, 0);
	if (s->cfa_expr) {
		const uint8_t *e = s->cfa_e;
		if (s->cfa_elen == 11 && !memcmp(e, PLT_HEAD, 6) && !memcmp(e + 7, PLT_TAIL, 4) && e[6] >= 0x30 &&
		    e[6] <= 0x3F)
			return pack(t[T_PLT], e[6] - 0x30, 0);
		if (s->cfa_elen == 4 && !memcmp(e, SIGNAL_CFA, 4) && ra->type == R_EXPR && ra->elen == 3 &&
		    !memcmp(ra->expr, SIGNAL_RA, 3))
			return pack(t[T_SIGNAL], 0, 0);
		return pack(t[T_UNSUPPORTED], 0, 0);
	}
	if (ra->type != R_OFFSET || ra->arg != -8)
		return pack(t[T_UNSUPPORTED], 0, 0);
	int typ;
	if (s->cfa_reg_none)
		return pack(t[T_UNSUPPORTED], 0, 0);
	if (s->cfa_reg == REG_RSP)
		typ = t[T_RSP];
	else if (s->cfa_reg == REG_RBP)
		typ = t[T_RBP];
	else
		return pack(t[T_UNSUPPORTED], 0, 0);
	i128 off = s->cfa_off;
	if (s->cfa_off_none || off % 8 || off / 8 < -32768 || off / 8 > 32767)
		return pack(t[T_UNSUPPORTED], 0, 0);
	const struct rule *rbp = &s->rbp;
	int rbp_off;
	if (rbp->type == R_NONE || rbp->type == R_SAME)
		rbp_off = 0;
	else if (rbp->type == R_OFFSET && rbp->arg % 8 == 0 && rbp->arg && rbp->arg / 8 >= -127 && rbp->arg / 8 <= 127)
		rbp_off = (int)(rbp->arg / 8);
	else
		rbp_off = RBP_UNKNOWN;
	return pack(typ, (int)(off / 8), rbp_off);
}

/* a pointer in a DW_EH_PE encoding (low nibble: the format); 0 ok, -1 unknown format */
static int rd_ptr(struct rd *r, int enc, i128 *out) {
	switch (enc & 0x0f) {
	case 0x00: *out = (i128)rd_n(r, 8); break; /* absptr (ELF64) */
	case 0x01: *out = rd_leb(r, 0); break;     /* uleb128 */
	case 0x02: *out = (i128)rd_n(r, 2); break;
	case 0x03: *out = (i128)rd_n(r, 4); break;
	case 0x04: *out = (i128)rd_n(r, 8); break;
	case 0x09: *out = rd_leb(r, 1); break; /* sleb128 */
	case 0x0a: *out = (int16_t)rd_n(r, 2); break;
	case 0x0b: *out = (int32_t)rd_n(r, 4); break;
	case 0x0c: *out = (int64_t)rd_n(r, 8); break;
	default: return -1;
	}
	return r->bad ? -1 : 0;
}

/* the FDE's initial location (or DW_CFA_set_loc) in .eh_frame: format + application */
static int rd_addr(const struct build *b, const struct section *sec, struct rd *r, int enc, i128 *out) {
	uint64_t field = (uint64_t)(r->p - sec->data);
	if (enc == 0xff || (enc & 0x80) || rd_ptr(r, enc, out))
		return -1; /* omitted or indirect: no code address */
	switch (enc & 0x70) {
	case 0x00: break;
	case 0x10: *out += (i128)sec->addr + field; break; /* pcrel */
	case 0x20:
		if (!b->has_text)
			return -1;
		*out += b->text_addr;
		break; /* textrel */
	case 0x30:
		if (!b->has_got)
			return -1;
		*out += b->got_addr;
		break; /* datarel */
	default: return -1;
	}
	return 0;
}

/* common/elf.py vaddr_to_offset(whole=True, end=...) */
static int to_offset(const struct build *b, i128 v, int end, i128 *out) {
	for (int i = 0; i < b->nsegs; i++) {
		const struct seg *g = &b->segs[i];
		i128 lo = g->vaddr, hi = (i128)g->vaddr + g->memsz;
		if ((lo <= v && v < hi) || (end && v == hi)) {
			*out = v - lo + g->off;
			return 0;
		}
	}
	return -1;
}

/* Run a CIE's or an FDE's program (pyelftools' _decode_CFI_table). For an FDE, each row goes
 * to b->rows; for a CIE, the last row goes to cie->last. 0 ok, -1 malformed. */
static int run(struct build *b, const struct section *sec, struct cie *cie, int is_fde, const uint8_t *p,
	       const uint8_t *end, struct state *cur) {
	struct rd r = {p, end, 0};
	int depth = 0;
	const struct state *base = is_fde && cie->has_last ? &cie->last : NULL;
	i128 ra_reg = cie->ra_reg;
	if (is_fde)
		b->nrows = 0;
	else
		cie->has_last = 0;

#define EMIT()                                                                                         \
	do {                                                                                           \
		if (is_fde) {                                                                          \
			if (grow((void **)&b->rows, &b->cap_rows, b->nrows + 1, sizeof(struct pcenc))) \
				return -1;                                                             \
			b->rows[b->nrows].pc = cur->pc;                                                \
			b->rows[b->nrows++].enc = encode(b, cur);                                      \
		} else {                                                                               \
			cie->last = *cur;                                                              \
			cie->has_last = 1;                                                             \
		}                                                                                      \
	} while (0)
#define SET(reg, typ, a, e, l)                            \
	do {                                              \
		struct rule rl_ = {(typ), (a), (e), (l)}; \
		if (st_add(cur, (reg)))                   \
			return -1;                        \
		if ((reg) == ra_reg)                      \
			cur->ra = rl_;                    \
		if ((reg) == REG_RBP)                     \
			cur->rbp = rl_;                   \
	} while (0)

	while (r.p < r.end) {
		uint8_t op = (uint8_t)rd_n(&r, 1);
		i128 reg, x;
		const uint8_t *blk;
		switch (op & 0xc0) {
		case 0x40: /* advance_loc */
			EMIT();
			cur->pc = sat(cur->pc + sat_mul(op & 0x3f, cie->caf));
			continue;
		case 0x80: /* offset */
			x = rd_leb(&r, 0);
			if (r.bad)
				return -1;
			SET((i128)(op & 0x3f), R_OFFSET, sat_mul(x, cie->daf), NULL, 0);
			continue;
		case 0xc0: /* restore */ reg = op & 0x3f; goto restore;
		}
		switch (op) {
		case 0x00: /* nop */
		case 0x2d: /* GNU_window_save / AARCH64_negate_ra_state */ break;
		case 0x01: /* set_loc */
			if (sec->eh) {
				if (rd_addr(b, sec, &r, cie->fde_enc, &x))
					return -1;
			} else {
				x = (i128)rd_n(&r, 8);
			}
			if (r.bad)
				return -1;
			EMIT();
			cur->pc = sat(x);
			break;
		case 0x02:
		case 0x03:
		case 0x04: /* advance_loc1/2/4 */
			x = (i128)rd_n(&r, op == 0x02 ? 1 : op == 0x03 ? 2 : 4);
			if (r.bad)
				return -1;
			EMIT();
			cur->pc = sat(cur->pc + sat_mul(x, cie->caf));
			break;
		case 0x05:
		case 0x11:
		case 0x2f: /* offset_extended, offset_extended_sf, GNU_negative_offset_extended */
			reg = rd_leb(&r, 0);
			x = rd_leb(&r, op == 0x11);
			if (r.bad)
				return -1;
			x = sat_mul(x, cie->daf);
			SET(reg, R_OFFSET, op == 0x2f ? -x : x, NULL, 0);
			break;
		case 0x14:
		case 0x15: /* val_offset, val_offset_sf */
			reg = rd_leb(&r, 0);
			x = rd_leb(&r, op == 0x15);
			if (r.bad)
				return -1;
			SET(reg, R_VAL_OFFSET, sat_mul(x, cie->daf), NULL, 0);
			break;
		case 0x06: /* restore_extended */
			reg = rd_leb(&r, 0);
			if (r.bad)
				return -1;
		restore:
			if (!is_fde || !base)
				return -1; /* in a CIE; or its CIE's table is empty (pyelftools asserts) */
			if (st_has(base, reg)) {
				if (st_add(cur, reg))
					return -1;
				if (reg == ra_reg)
					cur->ra = base->ra;
				if (reg == REG_RBP)
					cur->rbp = base->rbp;
			} else {
				st_del(cur, reg);
				if (reg == ra_reg)
					cur->ra.type = R_NONE;
				if (reg == REG_RBP)
					cur->rbp.type = R_NONE;
			}
			break;
		case 0x07:
		case 0x08: /* undefined, same_value */
			reg = rd_leb(&r, 0);
			if (r.bad)
				return -1;
			SET(reg, op == 0x07 ? R_UNDEFINED : R_SAME, 0, NULL, 0);
			break;
		case 0x09: /* register */
			reg = rd_leb(&r, 0);
			x = rd_leb(&r, 0);
			if (r.bad)
				return -1;
			SET(reg, R_REGISTER, x, NULL, 0);
			break;
		case 0x0a: /* remember_state */
			if (depth >= MAX_STACK)
				return -1;
			b->stack[depth++] = *cur;
			break;
		case 0x0b: /* restore_state: the row is popped, the pc kept */
			if (!depth)
				return -1;
			x = cur->pc;
			*cur = b->stack[--depth];
			cur->pc = x;
			break;
		case 0x0c:
		case 0x12: /* def_cfa, def_cfa_sf */
			reg = rd_leb(&r, 0);
			x = rd_leb(&r, op == 0x12);
			if (r.bad)
				return -1;
			cur->cfa_expr = cur->cfa_reg_none = cur->cfa_off_none = 0;
			cur->cfa_reg = reg;
			cur->cfa_off = op == 0x12 ? sat_mul(x, cie->daf) : x;
			break;
		case 0x0d: /* def_cfa_register: the offset stays (None after an expression) */
			reg = rd_leb(&r, 0);
			if (r.bad)
				return -1;
			cur->cfa_off_none = cur->cfa_expr ? 1 : cur->cfa_off_none;
			cur->cfa_expr = cur->cfa_reg_none = 0;
			cur->cfa_reg = reg;
			break;
		case 0x0e:
		case 0x13: /* def_cfa_offset, def_cfa_offset_sf: the register stays (None after an expression) */
			x = rd_leb(&r, op == 0x13);
			if (r.bad)
				return -1;
			cur->cfa_reg_none = cur->cfa_expr ? 1 : cur->cfa_reg_none;
			cur->cfa_expr = cur->cfa_off_none = 0;
			cur->cfa_off = op == 0x13 ? sat_mul(x, cie->daf) : x;
			break;
		case 0x0f: /* def_cfa_expression */
			x = rd_leb(&r, 0);
			if (r.bad || x < 0 || x > r.end - r.p)
				return -1;
			blk = r.p;
			r.p += (uint64_t)x;
			cur->cfa_expr = cur->cfa_reg_none = cur->cfa_off_none = 1;
			cur->cfa_e = blk;
			cur->cfa_elen = (uint64_t)x;
			break;
		case 0x10:
		case 0x16: /* expression, val_expression */
			reg = rd_leb(&r, 0);
			x = rd_leb(&r, 0);
			if (r.bad || x < 0 || x > r.end - r.p)
				return -1;
			blk = r.p;
			r.p += (uint64_t)x;
			SET(reg, op == 0x10 ? R_EXPR : R_VAL_EXPR, 0, blk, (uint64_t)x);
			break;
		case 0x2e: /* GNU_args_size: landing pads only */
			rd_leb(&r, 0);
			if (r.bad)
				return -1;
			break;
		default: return -1;
		}
	}
	if (r.bad)
		return -1;
	/* the last row, unless it says nothing (no CFA register, no register rule) */
	if (!cur->cfa_reg_none || cur->nregs > 0)
		EMIT();
	return 0;
#undef EMIT
#undef SET
}

/* one entry's header: length, id. 0 ok (end, id set), 1 ZERO terminator, -1 runs past the section */
struct entry {
	uint64_t off, end, id_pos;
	uint64_t id;
	int fmt64;
};

static int entry_at(const struct section *sec, uint64_t off, struct entry *e) {
	struct rd r = {sec->data + off, sec->data + sec->size, 0};
	uint64_t len = rd_n(&r, 4);
	if (r.bad)
		return -1;
	e->off = off;
	e->fmt64 = 0;
	if (len == 0) {
		e->end = off + 4;
		return 1;
	}
	if (len == 0xffffffff) {
		len = rd_n(&r, 8);
		e->fmt64 = 1;
	} else if (len >= 0xfffffff0) {
		return -1;
	}
	if (r.bad)
		return -1;
	uint64_t hdr = e->fmt64 ? 12 : 4;
	if (len > sec->size - off - hdr)
		return -1;
	e->end = off + hdr + len;
	e->id_pos = off + hdr;
	struct rd idr = {sec->data + e->id_pos, sec->data + e->end, 0};
	e->id = rd_n(&idr, e->fmt64 ? 8 : 4);
	if (idr.bad)
		e->id = 1; /* too short to say: neither a CIE nor a usable FDE */
	return 0;
}

static int is_cie(const struct section *sec, const struct entry *e) {
	if (sec->eh)
		return e->id == 0;
	return e->fmt64 ? e->id == UINT64_MAX : e->id == 0xffffffffu;
}

static uint64_t hash64(uint64_t x) {
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

/* the CIE at `off` of this section (parsed once), NULL when there is none or it is malformed */
static struct cie *cie_at(struct build *b, const struct section *sec, uint64_t off) {
	if (b->ncies * 2 >= b->hash_cap) {
		uint64_t cap = b->hash_cap ? b->hash_cap * 2 : 64;
		uint64_t *h = calloc(cap, sizeof(uint64_t));
		if (!h)
			return NULL;
		for (uint64_t i = 0; i < b->ncies; i++) {
			uint64_t j = hash64(b->cies[i].off) & (cap - 1);
			while (h[j])
				j = (j + 1) & (cap - 1);
			h[j] = i + 1;
		}
		free(b->cie_hash);
		b->cie_hash = h;
		b->hash_cap = cap;
	}
	uint64_t j = hash64(off) & (b->hash_cap - 1);
	while (b->cie_hash[j]) {
		struct cie *c = &b->cies[b->cie_hash[j] - 1];
		if (c->off == off)
			return c->ok ? c : NULL;
		j = (j + 1) & (b->hash_cap - 1);
	}
	if (grow((void **)&b->cies, &b->cap_cies, b->ncies + 1, sizeof(struct cie)))
		return NULL;
	struct cie *c = &b->cies[b->ncies];
	memset(c, 0, sizeof(*c));
	c->off = off;
	b->cie_hash[j] = ++b->ncies;

	struct entry e;
	if (off >= sec->size || entry_at(sec, off, &e) != 0 || !is_cie(sec, &e))
		return NULL;
	struct rd r = {sec->data + e.id_pos + (e.fmt64 ? 8 : 4), sec->data + e.end, 0};
	int version = (int)rd_n(&r, 1);
	const uint8_t *aug = r.p;
	while (r.p < r.end && *r.p)
		r.p++;
	uint64_t auglen = (uint64_t)(r.p - aug);
	rd_n(&r, 1); /* the NUL */
	if (version >= 4)
		rd_n(&r, 2); /* address_size, segment_size */
	c->caf = rd_leb(&r, 0);
	c->daf = rd_leb(&r, 1);
	c->ra_reg = version > 1 ? rd_leb(&r, 0) : (i128)rd_n(&r, 1);
	if (r.bad)
		return NULL;
	c->fde_enc = 0; /* absptr unless 'R' says otherwise */
	if (auglen && !(auglen >= 5 && !memcmp(aug, "armcc", 5))) {
		if (aug[0] != 'z') {
			for (uint64_t i = 0; i < auglen; i++)
				if (aug[i] != 'S')
					return NULL; /* "eh" and the like: not read */
			goto augmented;              /* "S" (a signal frame) alone: no augmentation data */
		}
		c->has_z = 1;
		struct rd q = r;
		i128 len = rd_leb(&q, 0);
		if (q.bad || len < 0 || len > q.end - q.p)
			return NULL;
		r.p = q.p + (uint64_t)len; /* the instructions follow the augmentation data */
		for (uint64_t i = 1; i < auglen; i++) {
			uint8_t ch = aug[i];
			i128 dummy;
			if (ch == 'L') {
				rd_n(&q, 1);
			} else if (ch == 'R') {
				c->fde_enc = (int)rd_n(&q, 1);
			} else if (ch == 'P') {
				int enc = (int)rd_n(&q, 1);
				if (rd_ptr(&q, enc, &dummy))
					return NULL;
			} else if (ch == 'z') {
				rd_leb(&q, 0);
			} else if (ch != 'S') {
				break;
			}
		}
		if (q.bad)
			return NULL;
	}
augmented:
	c->ins = r.p;
	c->ins_end = sec->data + e.end;
	c->ok = 1;
	return c;
}

static int cmp_range(const void *x, const void *y) {
	const i128 *a = x, *b = y;
	if (a[0] != b[0])
		return a[0] < b[0] ? -1 : 1;
	return a[1] < b[1] ? -1 : a[1] > b[1];
}

/* tracer/unwind/rows.py `_overlaps`, as written (it looks at two neighbours) */
static int overlaps(const struct build *b, i128 start, i128 end) {
	uint64_t lo = 0, hi = b->ncovered; /* first index with range start > start */
	while (lo < hi) {
		uint64_t mid = (lo + hi) / 2;
		if (b->covered[mid][0] <= start)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (int64_t j = (int64_t)lo - 1; j <= (int64_t)lo; j++)
		if (j >= 0 && (uint64_t)j < b->ncovered && b->covered[j][0] < end && start < b->covered[j][1])
			return 1;
	return 0;
}

static int do_section(struct build *b, const struct section *sec, int prio) {
	b->ncies = 0;
	if (b->cie_hash)
		memset(b->cie_hash, 0, b->hash_cap * sizeof(uint64_t));
	if (prio == 1 && b->ncovered > 1)
		qsort(b->covered, b->ncovered, sizeof(*b->covered), cmp_range);
	const char *name = sec->eh ? ".eh_frame" : ".debug_frame";
	uint64_t off = 0;
	while (off < sec->size) {
		struct entry e;
		int k = entry_at(sec, off, &e);
		if (k < 0)
			return fail(b, "%s: entry at %#llx runs past the section's end", name, (unsigned long long)off);
		if (k == 1 || is_cie(sec, &e)) {
			if (k == 0)
				cie_at(b, sec, off);
			off = e.end;
			continue;
		}
		off = e.end;
		/* an FDE */
		i128 cie_off = sec->eh ? (i128)e.id_pos - (i128)e.id : (i128)e.id;
		if (cie_off < 0 || cie_off >= (i128)sec->size)
			continue;
		struct cie *cie = cie_at(b, sec, (uint64_t)cie_off);
		if (!cie)
			continue;
		struct rd r = {sec->data + e.id_pos + (e.fmt64 ? 8 : 4), sec->data + e.end, 0};
		i128 start, range;
		if (sec->eh) {
			if (rd_addr(b, sec, &r, cie->fde_enc, &start) || rd_ptr(&r, cie->fde_enc & 0x0f, &range))
				continue;
			if (cie->has_z) {
				i128 len = rd_leb(&r, 0);
				if (r.bad || len < 0 || len > r.end - r.p)
					continue;
				r.p += (uint64_t)len;
			}
		} else {
			start = (i128)rd_n(&r, 8);
			range = (i128)rd_n(&r, 8);
		}
		if (r.bad)
			continue;
		i128 end = start + range;
		if (prio == 1 && overlaps(b, start, end))
			continue; /* .eh_frame has it */
		i128 lo, hi;
		if (to_offset(b, start, 0, &lo) || to_offset(b, end, 1, &hi) || hi > 0xFFFFFFFF || lo > hi)
			continue;
		if (!cie->decoded) {
			struct state s;
			st_init(&s, 0);
			cie->decoded = run(b, sec, cie, 0, cie->ins, cie->ins_end, &s) ? -1 : 1;
		}
		if (cie->decoded < 0)
			continue;
		struct state cur;
		if (cie->has_last)
			cur = cie->last;
		else
			st_init(&cur, 0);
		cur.pc = start;
		if (run(b, sec, cie, 1, r.p, r.end, &cur))
			continue; /* one undecodable FDE: its range falls back to frame pointers */
		b->fdes++;
		if (prio == 2) {
			if (grow((void **)&b->covered, &b->cap_covered, b->ncovered + 1, sizeof(*b->covered)))
				return fail(b, "out of memory");
			b->covered[b->ncovered][0] = start;
			b->covered[b->ncovered++][1] = end;
		}
		if (put(b, (uint32_t)hi, 0, pack(b->types[T_NONE], 0, 0)))
			return fail(b, "out of memory (or over 2^30 rows)");
		for (uint64_t i = 0; i < b->nrows; i++) {
			i128 pc = b->rows[i].pc;
			if (start <= pc && pc < end && put(b, (uint32_t)(pc - start + lo), prio, b->rows[i].enc))
				return fail(b, "out of memory (or over 2^30 rows)");
		}
	}
	return CFI_OK;
}

/* Sort the puts by (pc, priority), keeping their order among equals: an LSD radix sort (stable)
 * over bits 30..63 of the keys, 12 bits a pass; the low 30 bits (the sequence number) are in
 * order already. Passes where every key has the same digit are skipped. */
static int sort_keys(uint64_t **keys, uint64_t n) {
	enum { PASSES = 3, BITS = 12, LOW = 30 };
	if (n < 2)
		return 0;
	uint64_t *a = *keys, *t = malloc(n * sizeof(uint64_t));
	uint64_t(*cnt)[1 << BITS] = calloc(PASSES, sizeof(*cnt));
	if (!t || !cnt) {
		free(t);
		free(cnt);
		return -1;
	}
	for (uint64_t i = 0; i < n; i++)
		for (int p = 0; p < PASSES; p++)
			cnt[p][(a[i] >> (LOW + BITS * p)) & ((1 << BITS) - 1)]++;
	for (int p = 0; p < PASSES; p++) {
		int shift = LOW + BITS * p;
		uint64_t *c = cnt[p], sum = 0;
		if (c[(a[0] >> shift) & ((1 << BITS) - 1)] == n)
			continue;
		for (int d = 0; d < (1 << BITS); d++) {
			uint64_t v = c[d];
			c[d] = sum;
			sum += v;
		}
		for (uint64_t i = 0; i < n; i++)
			t[c[(a[i] >> shift) & ((1 << BITS) - 1)]++] = a[i];
		uint64_t *s = a;
		a = t;
		t = s;
	}
	free(cnt);
	free(t);
	*keys = a;
	return 0;
}

struct shdr {
	uint32_t name, type;
	uint64_t flags, addr, offset, size;
	uint32_t link, info;
};

static void shdr_parse(const uint8_t *p, struct shdr *s) {
	struct rd r = {p, p + 64, 0};
	s->name = (uint32_t)rd_n(&r, 4);
	s->type = (uint32_t)rd_n(&r, 4);
	s->flags = rd_n(&r, 8);
	s->addr = rd_n(&r, 8);
	s->offset = rd_n(&r, 8);
	s->size = rd_n(&r, 8);
	s->link = (uint32_t)rd_n(&r, 4);
	s->info = (uint32_t)rd_n(&r, 4);
}

/* `len` bytes at `off` of the file (size `size`), malloc'd; NULL when outside the file or unreadable.
 * Read, not mapped: a file that shrinks meanwhile gives an error, never a SIGBUS. */
static uint8_t *load(int fd, uint64_t size, uint64_t off, uint64_t len) {
	if (off > size || len > size - off)
		return NULL;
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return NULL;
	uint64_t got = 0;
	while (got < len) {
		ssize_t n = pread(fd, buf + got, len - got > (1u << 30) ? (1u << 30) : len - got, (off_t)(off + got));
		if (n <= 0) {
			free(buf);
			return NULL;
		}
		got += (uint64_t)n;
	}
	return buf;
}

#define SHT_NOBITS 8
#define SHF_COMPRESSED 0x800

static int build_fd(int fd, uint64_t size, const uint8_t *dbg, uint64_t dbg_len, const uint8_t *types,
		    struct cfi_result *res) {
	struct build B;
	struct build *b = &B;
	memset(b, 0, sizeof(B));
	b->err = res->error;
	memcpy(b->types, types, T_COUNT);
	uint8_t *ehdr = NULL, *shdrs = NULL, *phdrs = NULL, *strtab = NULL, *eh_data = NULL, *df_data = NULL;
	struct seg *segs = NULL;
	int rc = CFI_OK;
#define FAIL(...)                          \
	do {                               \
		rc = fail(b, __VA_ARGS__); \
		goto out;                  \
	} while (0)

	if (size < 64 || !(ehdr = load(fd, size, 0, 64)) || memcmp(ehdr, "\177ELF", 4))
		FAIL("not an ELF file");
	if (ehdr[4] != 2 || ehdr[5] != 1) {
		rc = CFI_FALLBACK; /* ELFCLASS32 or big-endian: pyelftools reads those */
		goto out;
	}
	struct rd h = {ehdr + 18, ehdr + 64, 0};
	uint32_t machine = (uint32_t)rd_n(&h, 2);
	h.p = ehdr + 32;
	uint64_t phoff = rd_n(&h, 8), shoff = rd_n(&h, 8);
	h.p = ehdr + 54;
	uint64_t phentsize = rd_n(&h, 2), phnum = rd_n(&h, 2);
	uint64_t shentsize = rd_n(&h, 2), shnum = rd_n(&h, 2), shstrndx = rd_n(&h, 2);
	if (machine != 62)
		goto out; /* not x86-64: no rows */

	/* section headers (e_shnum 0: the count in section 0's sh_size; e_shstrndx SHN_XINDEX: in its sh_link) */
	struct shdr s0 = {0}, s;
	if (shoff) {
		uint8_t *first;
		if (shentsize < 64 || !(first = load(fd, size, shoff, 64)))
			FAIL("section headers outside the file");
		shdr_parse(first, &s0);
		free(first);
		if (shnum == 0)
			shnum = s0.size;
		if (shstrndx == 0xffff)
			shstrndx = s0.link;
		if (shnum > (size - shoff) / shentsize || !(shdrs = load(fd, size, shoff, shnum * shentsize)))
			FAIL("section headers outside the file");
	} else {
		shnum = 0;
	}
	if (phnum == 0xffff)
		phnum = s0.info;

	/* PT_LOAD segments, in program header order */
	int nsegs = 0;
	if (phnum) {
		if (phentsize < 56 || phoff > size || phnum > (size - phoff) / phentsize ||
		    !(phdrs = load(fd, size, phoff, phnum * phentsize)) || !(segs = calloc(phnum, sizeof(*segs))))
			FAIL("program headers outside the file");
		for (uint64_t i = 0; i < phnum; i++) {
			struct rd r = {phdrs + i * phentsize, phdrs + i * phentsize + 56, 0};
			uint32_t type = (uint32_t)rd_n(&r, 4);
			rd_n(&r, 4);
			struct seg g;
			g.off = rd_n(&r, 8);
			g.vaddr = rd_n(&r, 8);
			rd_n(&r, 8); /* p_paddr */
			g.filesz = rd_n(&r, 8);
			g.memsz = rd_n(&r, 8);
			if (type == 1)
				segs[nsegs++] = g;
		}
	}
	b->segs = segs;
	b->nsegs = nsegs;

	/* .eh_frame and .debug_frame: the last section of each name, as pyelftools finds them */
	struct shdr str = {0}, eh = {0}, df = {0};
	int has_eh = 0, has_df = 0;
	if (shnum && shstrndx < shnum) {
		shdr_parse(shdrs + shstrndx * shentsize, &str);
		if (str.type != SHT_NOBITS && !(strtab = load(fd, size, str.offset, str.size)))
			FAIL("section names outside the file");
	}
	for (uint64_t i = 0; strtab && i < shnum; i++) {
		shdr_parse(shdrs + i * shentsize, &s);
		if (s.name >= str.size)
			continue;
		const char *nm = (const char *)strtab + s.name;
		uint64_t room = str.size - s.name;
#define IS(lit) (room > sizeof(lit) - 1 && !memcmp(nm, lit, sizeof(lit)))
		if (IS(".eh_frame")) {
			eh = s;
			has_eh = 1;
		} else if (IS(".debug_frame")) {
			df = s;
			has_df = 1;
		} else if (IS(".text") && !b->has_text) {
			b->text_addr = s.addr;
			b->has_text = 1;
		} else if (IS(".got") && !b->has_got) {
			b->got_addr = s.addr;
			b->has_got = 1;
		}
#undef IS
	}
	has_eh = has_eh && eh.type != SHT_NOBITS && eh.size;
	has_df = has_df && df.type != SHT_NOBITS && df.size;
	res->sources = (has_eh ? 1 : 0) | (has_df ? 2 : 0);
	if (has_eh && (eh.flags & SHF_COMPRESSED)) {
		rc = CFI_FALLBACK;
		goto out;
	}
	if (has_df && (df.flags & SHF_COMPRESSED) && !dbg) {
		rc = CFI_NEED_DEBUG_FRAME;
		goto out;
	}
	struct section secs[2];
	int prios[2], nsec = 0;
	if (has_eh) {
		if (!(eh_data = load(fd, size, eh.offset, eh.size)))
			FAIL(".eh_frame runs past the end of the file");
		secs[nsec] = (struct section){eh_data, eh.size, eh.addr, 1};
		prios[nsec++] = 2;
	}
	if (has_df) {
		if (dbg) {
			secs[nsec] = (struct section){dbg, dbg_len, df.addr, 0};
		} else {
			if (!(df_data = load(fd, size, df.offset, df.size)))
				FAIL(".debug_frame runs past the end of the file");
			secs[nsec] = (struct section){df_data, df.size, df.addr, 0};
		}
		prios[nsec++] = 1;
	}
	for (int i = 0; i < nsec && rc == CFI_OK; i++)
		rc = do_section(b, &secs[i], prios[i]);
	if (rc != CFI_OK)
		goto out;

	/* resolve: per pc the highest priority, the last put among those; merge equal neighbours */
	if (sort_keys(&b->keys, b->nput))
		FAIL("out of memory");
	if (!(res->rows = malloc((b->nput ? b->nput : 1) * sizeof(struct cfi_row))))
		FAIL("out of memory");
	uint64_t n = 0;
	uint32_t last = 0;
	for (uint64_t i = 0; i < b->nput; i++) {
		uint64_t k = b->keys[i];
		if (i + 1 < b->nput && (b->keys[i + 1] >> 32) == (k >> 32))
			continue;
		uint32_t enc = b->encs[k & ((1u << 30) - 1)];
		if (n && enc == last)
			continue;
		last = enc;
		struct cfi_row *row = &res->rows[n++];
		row->pc = (uint32_t)(k >> 32);
		row->cfa_type = (uint8_t)enc;
		row->cfa_off = (int16_t)(uint16_t)(enc >> 8);
		row->rbp_off = (int8_t)(uint8_t)(enc >> 24);
	}
	res->nrows = n;
	res->fdes = b->fdes;
out:
#undef FAIL
	free(ehdr);
	free(shdrs);
	free(phdrs);
	free(strtab);
	free(eh_data);
	free(df_data);
	free(segs);
	free(b->keys);
	free(b->encs);
	free(b->covered);
	free(b->cies);
	free(b->cie_hash);
	free(b->rows);
	if (rc != CFI_OK) {
		free(res->rows);
		res->rows = NULL;
		res->nrows = 0;
	}
	return rc;
}

/* The rows of the ELF file open at `fd` (read with pread; the fd stays open). `debug_frame`: the
 * decompressed .debug_frame when an earlier call answered CFI_NEED_DEBUG_FRAME, else NULL.
 * `types`: the cfa type values none, rsp, rbp, plt, signal, stop, unsupported. Returns CFI_OK
 * (res->rows to cfi_free), CFI_ERROR (res->error says why), CFI_FALLBACK (a file this decoder does
 * not read: ELFCLASS32, big-endian, compressed .eh_frame) or CFI_NEED_DEBUG_FRAME. */
API int cfi_build_fd(int fd, const uint8_t *debug_frame, uint64_t debug_frame_len, const uint8_t *types,
		     struct cfi_result *res) {
	memset(res, 0, sizeof(*res));
	struct stat st;
	if (fstat(fd, &st)) {
		snprintf(res->error, sizeof(res->error), "fstat failed");
		return CFI_ERROR;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(res->error, sizeof(res->error), "not a regular file");
		return CFI_ERROR;
	}
	return build_fd(fd, (uint64_t)st.st_size, debug_frame, debug_frame_len, types, res);
}

API int cfi_build_path(const char *path, const uint8_t *debug_frame, uint64_t debug_frame_len, const uint8_t *types,
		       struct cfi_result *res) {
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		memset(res, 0, sizeof(*res));
		snprintf(res->error, sizeof(res->error), "cannot open");
		return CFI_ERROR;
	}
	int rc = cfi_build_fd(fd, debug_frame, debug_frame_len, types, res);
	close(fd);
	return rc;
}

API void cfi_free(struct cfi_result *res) {
	free(res->rows);
	res->rows = NULL;
	res->nrows = 0;
}

/* the layout this library was built with: sizeof(struct cfi_result) << 8 | version */
API uint32_t cfi_abi(void) { return (uint32_t)sizeof(struct cfi_result) << 8 | 1; }
