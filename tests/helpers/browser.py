"""A real browser for the playground's tests: Playwright driving Debian's Chromium (headless,
launched by its path: Playwright's own browser downloads cannot run here), with a fake microphone
and autoplay allowed, so recording and Web Audio playback run as they do for a user.

Test modules call ``skip_without_browser()`` first (so that no server starts for tests that will
skip) and use the fixtures, which their folder's conftest imports (``from tests.helpers.browser
import browser, page``). They skip, saying what to install, where Playwright or Chromium is
missing (``scripts/setup.sh --test`` installs both).
"""

from __future__ import annotations

import shutil

import pytest

API_KEY = "playground-key"
CHROMIUM_FLAGS = [
    "--autoplay-policy=no-user-gesture-required",  # audio plays without a click the test cannot make
    "--use-fake-ui-for-media-stream",  # the microphone is allowed without a prompt
    "--use-fake-device-for-media-stream",  # and is a generated tone
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def launch(playwright):
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS)


def skip_without_browser() -> None:
    """Skips the calling test module, or the test, where Playwright or Chromium is missing."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip(
            "Playwright is not installed (bash scripts/setup.sh --test installs it)", allow_module_level=True
        )
    if chromium_path() is None:
        pytest.skip(
            "Chromium is not installed (bash scripts/setup.sh --test installs Debian's chromium)",
            allow_module_level=True,
        )


@pytest.fixture(scope="module")
def browser():
    skip_without_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


class Page:
    """A fresh browser context (its own session storage) and one page in it; every console error
    and uncaught exception is kept in ``errors``."""

    def __init__(self, browser, key: str | None):
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        if key is not None:  # as if entered earlier in this browser session
            self.context.add_init_script(f"sessionStorage.setItem('omni.apiKey', {key!r})")
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def open(self, url: str, tab: str = "") -> Page:
        """The playground of the server at ``url``, once it has read what the server serves."""
        self.page.goto(f"{url}/playground" + (f"#{tab}" if tab else ""))
        self.page.wait_for_selector("body[data-ready=true]", state="attached", timeout=15_000)
        return self

    def data(self, selector: str) -> dict[str, str]:
        """The ``data-*`` attributes of the element: where the page reports what it did."""
        return self.page.eval_on_selector(selector, "element => ({...element.dataset})")

    def tabs(self) -> list[str]:
        return self.page.locator("#tabs [role=tab]").all_inner_texts()


@pytest.fixture
def page(browser):
    """A page whose session already holds the API key."""
    opened = Page(browser, API_KEY)
    yield opened
    opened.context.close()


@pytest.fixture
def keyless_page(browser):
    """A page of a browser session that has no key yet."""
    opened = Page(browser, None)
    yield opened
    opened.context.close()
