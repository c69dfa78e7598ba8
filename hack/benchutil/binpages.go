package benchutil

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// BinaryPages is how much of a process's executable is resident, by ELF
// section (.text, .rodata, .gopclntab...), in KiB: the file-backed part of
// its RSS that is the binary's. A page counts when it is present in the
// process's page table (/proc/PID/pagemap), which includes the neighbours
// the kernel maps around each page touched (fault-around).
func BinaryPages(pid int) (map[string]int, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	f, err := elf.Open(exe)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type span struct {
		lo, hi uint64
		name   string
	}
	var secs []span
	for _, s := range f.Sections {
		if s.Addr != 0 && s.Flags&elf.SHF_ALLOC != 0 && s.Type != elf.SHT_NOBITS {
			secs = append(secs, span{s.Addr, s.Addr + s.Size, s.Name})
		}
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i].lo < secs[j].lo })

	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer maps.Close()
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	const page = 4096
	out := map[string]int{}
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		entries := make([]byte, (b-a)/page*8)
		if _, err := pm.ReadAt(entries, int64(a/page*8)); err != nil {
			return nil, err
		}
		for i := uint64(0); i < (b-a)/page; i++ {
			if binary.LittleEndian.Uint64(entries[i*8:])>>63 == 0 {
				continue
			}
			addr := a + i*page
			name := "other"
			for _, s := range secs {
				if addr < s.hi && addr+page > s.lo {
					name = s.name
					break
				}
			}
			out[name] += page / 1024
		}
	}
	return out, sc.Err()
}

// BinaryPagesLine is BinaryPages as one line, the largest sections first.
func BinaryPagesLine(pid int) string {
	m, err := BinaryPages(pid)
	if err != nil {
		return "? (" + err.Error() + ")"
	}
	names := make([]string, 0, len(m))
	total := 0
	for n, kb := range m {
		names = append(names, n)
		total += kb
	}
	sort.Slice(names, func(i, j int) bool { return m[names[i]] > m[names[j]] })
	parts := make([]string, 0, len(names))
	for _, n := range names {
		if m[n] >= 256 {
			parts = append(parts, fmt.Sprintf("%s %.1f", n, float64(m[n])/1024))
		}
	}
	return fmt.Sprintf("%.1f MiB: %s MiB", float64(total)/1024, strings.Join(parts, ", "))
}
