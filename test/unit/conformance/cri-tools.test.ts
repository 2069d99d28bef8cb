/** The crictl/critest lookup the tests use: $CRICTL/$CRITEST, then PATH, then shared/cri-tools/. */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { criToolMissingNotice, criToolPath } from '../../helpers/cri-tools.js';

describe('criToolPath', () => {
  let dir: string;
  const tool = (sub: string, name: string, mode = 0o755): string => {
    mkdirSync(path.join(dir, sub), { recursive: true });
    const file = path.join(dir, sub, name);
    writeFileSync(file, '#!/bin/sh\n');
    chmodSync(file, mode);
    return file;
  };
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'cri-tools-'));
  });
  afterEach(() => {
    vi.unstubAllEnvs();
    rmSync(dir, { recursive: true, force: true });
  });

  it('takes $CRICTL first, then the first executable on PATH', () => {
    const onPath = tool('bin-b', 'crictl');
    tool('bin-a', 'crictl', 0o644); // not executable: passed over
    vi.stubEnv('PATH', [path.join(dir, 'bin-a'), path.join(dir, 'bin-b')].join(path.delimiter));
    vi.stubEnv('CRICTL', '');
    expect(criToolPath('crictl')).toBe(onPath);
    const chosen = tool('elsewhere', 'my-crictl');
    vi.stubEnv('CRICTL', chosen);
    expect(criToolPath('crictl')).toBe(chosen);
  });

  it('reports a $CRITEST that names no executable as absent, without falling back to PATH', () => {
    tool('bin', 'critest');
    vi.stubEnv('PATH', path.join(dir, 'bin'));
    vi.stubEnv('CRITEST', path.join(dir, 'missing', 'critest'));
    expect(criToolPath('critest')).toBeNull();
    expect(criToolMissingNotice('critest')).toContain(`CRITEST=${path.join(dir, 'missing', 'critest')} is not an executable file`);
  });

  it('names the variable, PATH and the shared directory when nothing is set', () => {
    vi.stubEnv('CRICTL', '');
    const notice = criToolMissingNotice('crictl');
    expect(notice).toMatch(/^crictl .* not found: CRICTL is unset, it is not on PATH, and not in \/\S+\/cri-tools/);
    expect(notice).toContain('set CRICTL=/path/to/crictl');
  });
});
