import { describe, expect, it } from 'vitest';
import {
  formatResourcePath,
  formatResourceUri,
  isResourcePath,
  parseResourcePath,
  parseResourceUri,
  RESOURCE_SEGMENT_MAX_CHARS,
  resourceUrlPath,
} from '../../../src/attest/resource-path.js';
import { isReason } from '../../../src/common/errors.js';

function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(isReason(err, 'ATTEST_RESOURCE_PATH_INVALID')).toBe(true);
    return (err as Error).message;
  }
  throw new Error('expected a refusal');
}

describe('resource paths', () => {
  it("accepts trustee's grammar: letters, digits, _ - . in each of three segments, no leading dot", () => {
    expect(parseResourcePath('default/key/1')).toEqual({ repository: 'default', type: 'key', tag: '1' });
    expect(parseResourcePath('my-repo_1/tls.cert/v1.2-rc_3')).toEqual({ repository: 'my-repo_1', type: 'tls.cert', tag: 'v1.2-rc_3' });
    expect(parseResourcePath('-a/_b/c..')).toEqual({ repository: '-a', type: '_b', tag: 'c..' });
    const p = parseResourcePath('a/b/c');
    expect(formatResourcePath(p)).toBe('a/b/c');
    expect(resourceUrlPath(p)).toBe('/kbs/v0/resource/a/b/c');
  });

  it.each([
    ['a/b', '3 segments, got 2'],
    ['a/b/c/d', '3 segments, got 4'],
    ['', '3 segments, got 1'],
    ['a//c', 'has an empty type'],
    ['/b/c', 'has an empty repository'],
    ['a/b/', 'has an empty tag'],
    ['../b/c', 'repository ".." must be letters'],
    ['a/../c', 'type ".." must be letters'],
    ['a/b/..', 'tag ".." must be letters'],
    ['a/./c', 'type "." must be letters'],
    ['a/b/.hidden', 'tag ".hidden"'],
    ['a/b/c d', 'tag "c d"'],
    ['a/b/c%2e', 'tag "c%2e"'],
    ['a\\b/c/d', 'repository "a\\\\b"'],
    ['a/b/c?x=1', 'tag "c?x=1"'],
    ['a/b/\u00e9', 'tag "\u00e9"'],
    ['a/b/c\u0000', 'tag "c\\u0000"'],
  ])('refuses %j', (text, message) => {
    expect(refusal(() => parseResourcePath(text))).toContain(message);
    expect(isResourcePath(text)).toBe(false);
  });

  it('refuses oversize segments and paths', () => {
    const long = 'x'.repeat(RESOURCE_SEGMENT_MAX_CHARS + 1);
    expect(parseResourcePath(`a/b/${'x'.repeat(RESOURCE_SEGMENT_MAX_CHARS)}`).tag.length).toBe(RESOURCE_SEGMENT_MAX_CHARS);
    expect(refusal(() => parseResourcePath(`a/b/${long}`))).toContain(`tag is ${RESOURCE_SEGMENT_MAX_CHARS + 1} characters`);
    expect(refusal(() => parseResourcePath(`${long}/${long}/${long}`))).toMatch(/over 302/);
  });

  it('names where the path came from', () => {
    expect(refusal(() => parseResourcePath('a/b', '/resources/3/path'))).toMatch(/^\/resources\/3\/path "a\/b"/);
  });
});

describe('kbs:// URIs', () => {
  it('parses kbs:///repo/type/tag and kbs://host[:port]/repo/type/tag', () => {
    expect(parseResourceUri('kbs:///default/key/1')).toEqual({ authority: null, path: { repository: 'default', type: 'key', tag: '1' } });
    expect(parseResourceUri('kbs://kbs.example:8080/default/key/1').authority).toBe('kbs.example:8080');
    expect(parseResourceUri('kbs://10.0.2.2/a/b/c').authority).toBe('10.0.2.2');
    expect(parseResourceUri('kbs://[fd00::1]:8080/a/b/c').authority).toBe('[fd00::1]:8080');
    expect(formatResourceUri({ repository: 'a', type: 'b', tag: 'c' })).toBe('kbs:///a/b/c');
  });

  it.each([
    ['https:///a/b/c', 'must start with kbs://'],
    ['kbs:/a/b/c', 'must start with kbs://'],
    ['kbs://', 'names no resource'],
    ['kbs:///a/b', '3 segments, got 2'],
    ['kbs:///a/../c', 'type ".."'],
    ['kbs:///a/%2e%2e/c', "must not carry '?', '#' or '%'"],
    ['kbs:///a/b/c?x', "must not carry '?', '#' or '%'"],
    ['kbs:///a/b/c#f', "must not carry '?', '#' or '%'"],
    ['kbs://user@host/a/b/c', 'host "user@host" is not host[:port]'],
    ['kbs://host:99999/a/b/c', 'host "host:99999" is not host[:port]'],
    ['kbs://host:/a/b/c', 'is not host[:port]'],
    [`kbs:///a/b/${'x'.repeat(1100)}`, 'over 1024'],
  ])('refuses %j', (text, message) => {
    expect(refusal(() => parseResourceUri(text))).toContain(message);
  });
});
