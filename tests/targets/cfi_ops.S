/* CFI programs using every opcode the unwind-table decoders read (tests/test_cfi_native.py):
 * never run, only decoded. -DDEBUG_FRAME: in .debug_frame only; -DBOTH: in both sections (the
 * .debug_frame FDEs then duplicate the .eh_frame ones and are dropped); -DEXTRA: functions
 * pyelftools cannot read (a signal frame in .debug_frame, GNU_negative_offset_extended, an unknown
 * opcode), checked against rows written down here. */
#if defined(DEBUG_FRAME)
	.cfi_sections .debug_frame
#elif defined(BOTH)
	.cfi_sections .eh_frame, .debug_frame
#endif
	.text
	.globl fn_a
	.type fn_a,@function
fn_a:
	.cfi_startproc
#ifndef DEBUG_FRAME
	.cfi_personality 0x9b, DW.ref.pers
	.cfi_lsda 0x1b, .Llsda
#endif
	pushq %rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	movq %rsp, %rbp
	.cfi_def_cfa_register %rbp
	pushq %rbx
	.cfi_offset %rbx, -24
	.cfi_remember_state
	.cfi_escape 0x2e, 0x10                  /* GNU_args_size 16 */
	nop
	.cfi_register %r12, %r13
	.cfi_same_value %r14
	.cfi_undefined %r15
	nop
	.cfi_restore %rbx
	.cfi_restore %rbp
	nop
	.cfi_restore_state
	.cfi_escape 0x12, 0x07, 0x7e            /* def_cfa_sf rsp, -2 x -8 */
	nop
	.cfi_escape 0x12, 0x06, 0x7c            /* def_cfa_sf rbp, -4 x -8 */
	nop
	.cfi_escape 0x11, 0x06, 0x7d            /* offset_extended_sf rbp, -3 x -8 */
	nop
	.cfi_escape 0x14, 0x03, 0x02            /* val_offset rbx */
	.cfi_escape 0x15, 0x03, 0x7f            /* val_offset_sf rbx */
	.cfi_val_offset %r12, -40
	nop
	.cfi_escape 0x10, 0x03, 0x02, 0x77, 0x10        /* expression rbx */
	.cfi_escape 0x16, 0x0c, 0x02, 0x77, 0x18        /* val_expression r12 */
	nop
	.cfi_def_cfa %rsp, 24
	.skip 300, 0x90                         /* advance_loc2 */
	.cfi_def_cfa_offset 32
	.skip 70000, 0x90                       /* advance_loc4 */
	.cfi_def_cfa_offset 40
	nop
	/* the lazy-binding PLT's CFA: rsp + 8 + ((rip & 15) >= 11) << 3 */
	.cfi_escape 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22
	nop
	.cfi_def_cfa_register %rsp              /* after an expression: no offset */
	nop
	.cfi_escape 0x0f, 0x02, 0x77, 0x08      /* def_cfa_expression rsp + 8 */
	nop
	.cfi_def_cfa_offset 8                   /* after an expression: no register */
	nop
	.cfi_def_cfa %rsp, 12
	nop
	.cfi_def_cfa %rax, 16
	nop
	.cfi_def_cfa %rsp, 8
	.cfi_offset %rbp, -8
	nop
	.cfi_offset %rbp, -1032
	nop
	.cfi_offset %rip, -16
	nop
	.cfi_escape 0x0c, 0x07, 0x80, 0x80, 0x04        /* def_cfa rsp, 65536 */
	nop
	.cfi_escape 0x00, 0x2d                  /* nop, GNU_window_save */
	ret
	.cfi_endproc
	.size fn_a, .-fn_a

#if !defined(DEBUG_FRAME) && !defined(BOTH)
	/* glibc's __restore_rt */
	.globl fn_sig
	.type fn_sig,@function
	nop
fn_sig:
	.cfi_startproc simple
	.cfi_signal_frame
	.cfi_escape 0x0f, 0x04, 0x77, 0xa0, 0x01, 0x06
	.cfi_escape 0x10, 0x06, 0x03, 0x77, 0xf8, 0x00
	.cfi_escape 0x10, 0x10, 0x03, 0x77, 0xa8, 0x01
	nop
	movq $15, %rax
	syscall
	.cfi_endproc
	.size fn_sig, .-fn_sig
#endif

	.globl fn_stop
	.type fn_stop,@function
fn_stop:
	.cfi_startproc
	.cfi_undefined %rip
	xorl %ebp, %ebp
	nop
	.cfi_same_value %rip
	nop
	ret
	.cfi_endproc
	.size fn_stop, .-fn_stop

	.globl fn_empty
	.type fn_empty,@function
fn_empty:
	.cfi_startproc simple
	nop
	ret
	.cfi_endproc
	.size fn_empty, .-fn_empty

	.globl fn_last
	.type fn_last,@function
fn_last:
	.cfi_startproc
	subq $8, %rsp
	.cfi_adjust_cfa_offset 8
	addq $8, %rsp
	.cfi_adjust_cfa_offset -8
	ret
	.cfi_endproc
	.size fn_last, .-fn_last

#ifdef EXTRA
	.globl fn_negoff
	.type fn_negoff,@function
fn_negoff:
	.cfi_startproc
	pushq %rbp
	.cfi_def_cfa_offset 16
	.cfi_escape 0x2f, 0x06, 0x02            /* GNU_negative_offset_extended rbp: -(2 x -8) */
	nop
	popq %rbp
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size fn_negoff, .-fn_negoff

	.globl fn_unknown
	.type fn_unknown,@function
fn_unknown:
	.cfi_startproc
	pushq %rbp
	.cfi_def_cfa_offset 16
	.cfi_escape 0x3f                        /* no such opcode: this FDE is skipped */
	popq %rbp
	ret
	.cfi_endproc
	.size fn_unknown, .-fn_unknown

#ifdef DEBUG_FRAME
	.globl fn_sig
	.type fn_sig,@function
fn_sig:
	.cfi_startproc simple
	.cfi_signal_frame                       /* a CIE whose augmentation is "S" alone */
	.cfi_escape 0x0f, 0x04, 0x77, 0xa0, 0x01, 0x06
	.cfi_escape 0x10, 0x10, 0x03, 0x77, 0xa8, 0x01
	nop
	syscall
	.cfi_endproc
	.size fn_sig, .-fn_sig
#endif
#endif

#ifndef DEBUG_FRAME
	.section .gcc_except_table,"a",@progbits
.Llsda:
	.byte 0xff, 0xff, 0x01, 0x00
	.data
	.hidden DW.ref.pers
	.weak DW.ref.pers
	.align 8
DW.ref.pers:
	.quad pers
	.text
	.globl pers
pers:
	ret
#endif
